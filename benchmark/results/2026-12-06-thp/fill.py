import socket, sys, time, os
# Fills a stream with N entries of SIZE bytes over a raw RESP pipeline (depth 64),
# then prints the server's CPU seconds and minor faults spent.
port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
pid = int(sys.argv[4])
def stat():
    f = open(f'/proc/{pid}/stat').read().rsplit(')',1)[1].split()
    return int(f[7]), (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')
s = socket.create_connection(('127.0.0.1', port))
payload = b'x' * size
cmd = b'*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nv\r\n$%d\r\n%s\r\n' % (size, payload)
f0, c0 = stat()
t0 = time.time()
depth = 64
sent = 0; got = 0
buf = b''
while got < n:
    while sent < n and sent - got < depth:
        s.sendall(cmd); sent += 1
    data = s.recv(1 << 20)
    got += data.count(b'\r\n') // 2
f1, c1 = stat()
print(f"entries={n} size={size} cpu_s={c1-c0:.2f} us_per_entry={(c1-c0)/n*1e6:.1f} faults={f1-f0} wall={time.time()-t0:.1f}")
