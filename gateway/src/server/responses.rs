//! A connection's responses, kept in request order until they are written.
//!
//! The reader takes a [`Place`] for each request as it admits it; the
//! request's task fills its place when it is done. The task that fills the
//! front place writes it, and the places after it that are ready, itself,
//! unless the writer task is writing: then it wakes the writer, which
//! writes the places at the front as they fill. Admitting a request, or
//! filling a place behind the front, wakes nobody.
//!
//! The writer task used to write every response: the request's task woke
//! it, and when that task had just woken another (a produce request's
//! append wakes the fetches waiting for the partition), tokio moved the
//! other to its run queue and woke the second worker thread to take it
//! (benchmark/README.md, issue #14, eighteenth round).
//!
//! The writer used to receive each request's task handle through a channel
//! and wait on it. Every admitted request then woke the writer twice (for
//! the handle, then for the answer), and the first wake, made while the
//! request's new task waited in the worker's next-task slot, pushed that
//! task to the run queue and woke the other worker thread to steal it: at a
//! low request rate each request crossed threads, and every crossing is a
//! futex wake and a context switch (an idle virtual CPU woken, on a VM).
//! Now no wake of the gateway's own hands a request to the other thread:
//! its task, its Redis connection's task and the writer run on whichever
//! thread the sockets wake.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use super::{Response, write_chunks};

/// Where a connection's responses are written: its socket (or TLS stream),
/// buffered so that pipelined responses that are ready share a write.
pub(super) type Out = BufWriter<Box<dyn AsyncWrite + Send + Unpin>>;

/// How a [`Responses::drain`] ended.
pub(super) enum Drained {
    /// The front request is still being worked on.
    Waiting,
    /// The reader is done and everything has been written, or the
    /// responses were dropped ([`Responses::stop`]).
    End,
    /// The front request's task ended without an answer.
    Abandoned,
    /// The front request closes the connection (a failed acks=0 produce).
    Closed,
    /// The connection could not be written to.
    Failed,
}

/// The responses of one connection, in request order.
pub(super) struct Responses {
    queue: Mutex<Queue>,
    /// The connection's write side: whoever holds it writes the front.
    /// Taken (and so closed) when the writer task ends.
    pub(super) out: tokio::sync::Mutex<Option<Out>>,
    /// Wakes the writer: the front place was filled, or the reader is done.
    wake: Notify,
    /// Places not yet written, at most `broker.max_inflight_requests`: the
    /// reader waits for room before it admits another request.
    room: Arc<Semaphore>,
}

#[derive(Default)]
struct Queue {
    places: VecDeque<Entry>,
    /// The number of the place at the front (places are numbered from 0 in
    /// request order).
    front: u64,
    /// The reader admits no more requests.
    closed: bool,
    /// The writer has stopped: nothing more is kept.
    gone: bool,
}

struct Entry {
    state: State,
    _room: OwnedSemaphorePermit,
}

enum State {
    Waiting,
    /// `None`: nothing to write (an acks=0 produce).
    Filled(Option<Response>),
    /// The request's task ended without an answer (it panicked).
    Abandoned,
    /// The request closes the connection after the answers before it.
    Close,
}

/// What the writer finds at the front.
pub(super) enum Front {
    /// The next response, and whether the one after it is ready too (then
    /// the two share a write).
    Ready(Option<Response>, bool),
    /// The front request is still being worked on.
    Waiting,
    /// The reader is done and everything has been written.
    End,
    /// The front request's task ended without an answer.
    Abandoned,
    /// The front request closes the connection.
    Close,
}

/// A request's place in the response order; filled once, by its task.
/// Dropped unfilled (the task panicked), it tells the writer to close the
/// connection rather than wait for it for ever.
pub(super) struct Place {
    responses: Arc<Responses>,
    number: u64,
    filled: bool,
}

/// A connection's write side that fails a write or flush making no
/// progress for `limit` (`broker.connections_max_idle`): a client that
/// reads none of its answers would otherwise hold the writer, and with it
/// the connection, its slot and its queued answers, for ever. Kafka closes
/// such a connection once it has been idle that long (its selector sees no
/// progress on a muted channel). A client that reads, however slowly,
/// keeps it.
struct StallLimit<W> {
    inner: W,
    limit: Duration,
    /// Armed while a write waits for the socket.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<W: AsyncWrite + Unpin> StallLimit<W> {
    fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        ready!(stalled.as_mut().poll(cx));
        self.stalled = None;
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the client read nothing for {limit:?}"),
        )))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for StallLimit<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.poll(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.poll(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.poll(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Responses {
    /// `stall_limit`: how long a write may make no progress before the
    /// connection is given up (`broker.connections_max_idle`).
    pub(super) fn new(
        max_inflight: usize,
        stall_limit: Duration,
        write: impl AsyncWrite + Send + Unpin + 'static,
    ) -> Arc<Responses> {
        let write: Box<dyn AsyncWrite + Send + Unpin> = Box::new(StallLimit {
            inner: write,
            limit: stall_limit,
            stalled: None,
        });
        Arc::new(Responses {
            queue: Mutex::default(),
            out: tokio::sync::Mutex::new(Some(BufWriter::new(write))),
            wake: Notify::new(),
            room: Arc::new(Semaphore::new(max_inflight.max(1))),
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic while the lock is held leaves the queue consistent (no
        // step of it can panic half-way): go on with it.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next place in the response order, once there is room for it;
    /// `None` when the writer has stopped.
    pub(super) async fn place(self: &Arc<Self>) -> Option<Place> {
        let room = self.room.clone().acquire_owned().await.ok()?;
        let mut queue = self.queue();
        if queue.gone {
            return None;
        }
        let number = queue.front + queue.places.len() as u64;
        queue.places.push_back(Entry {
            state: State::Waiting,
            _room: room,
        });
        Some(Place {
            responses: self.clone(),
            number,
            filled: false,
        })
    }

    /// Queues a response that is ready now (SASL and error answers);
    /// `false` when the writer has stopped.
    pub(super) async fn answer(self: &Arc<Self>, bytes: Bytes) -> bool {
        let Some(place) = self.place().await else {
            return false;
        };
        place.fill(Some(Response::bare(vec![bytes]))).await;
        true
    }

    /// The reader admits no more: the writer ends once it has written what
    /// was admitted.
    pub(super) fn close(&self) {
        self.queue().closed = true;
        self.wake.notify_one();
    }

    /// Takes the front response when it is ready.
    pub(super) fn front(&self) -> Front {
        let mut queue = self.queue();
        if queue.gone {
            return Front::End;
        }
        let Some(entry) = queue.places.front_mut() else {
            return if queue.closed { Front::End } else { Front::Waiting };
        };
        match entry.state {
            State::Waiting => Front::Waiting,
            State::Abandoned => Front::Abandoned,
            State::Close => Front::Close,
            State::Filled(_) => {
                // Its room is given back as the writer takes it.
                let Some(Entry {
                    state: State::Filled(response),
                    ..
                }) = queue.places.pop_front()
                else {
                    unreachable!("the front entry was filled");
                };
                queue.front += 1;
                let next_ready = queue
                    .places
                    .front()
                    .is_some_and(|next| !matches!(next.state, State::Waiting));
                Front::Ready(response, next_ready)
            }
        }
    }

    /// Writes the front responses to `out` as long as they are ready
    /// (holding `out`, the writer's lock, keeps them in order); `None`: the
    /// writer task has ended.
    pub(super) async fn drain(&self, out: &mut Option<Out>) -> Drained {
        let Some(out) = out.as_mut() else {
            return Drained::End;
        };
        loop {
            match self.front() {
                Front::Ready(response, next_ready) => {
                    if let Some(response) = &response
                        && write_chunks(out, &response.chunks).await.is_err()
                    {
                        return Drained::Failed;
                    }
                    // Pipelined responses that are ready share a write; one
                    // whose successor is still being worked on goes out now
                    // (a request in flight is not a reason to hold the
                    // answer to an earlier one: the client may be waiting
                    // for it before it sends more). What the response holds
                    // (its budget, the next Read's turn) is given back once
                    // it is in the socket or the buffer shared with the
                    // next one.
                    if !next_ready && out.flush().await.is_err() {
                        return Drained::Failed;
                    }
                    drop(response);
                }
                Front::Waiting => return Drained::Waiting,
                Front::End => {
                    let _ = out.flush().await;
                    return Drained::End;
                }
                Front::Abandoned => {
                    // The answers before it go out before the end.
                    let _ = out.flush().await;
                    return Drained::Abandoned;
                }
                Front::Close => {
                    let _ = out.flush().await;
                    return Drained::Closed;
                }
            }
        }
    }

    /// Waits until the front place may have been filled (or the reader
    /// closed). A wake given while the writer was not waiting is kept, so
    /// none is missed between [`Responses::front`] and this.
    pub(super) async fn changed(&self) {
        self.wake.notified().await;
    }

    /// The writer has stopped: drop what is kept and refuse new places
    /// (the reader then stops too).
    pub(super) fn stop(&self) {
        let mut queue = self.queue();
        queue.gone = true;
        queue.places.clear();
        drop(queue);
        self.room.close();
    }

    /// Sets a place's state; whether it is the front place (only its
    /// filling lets the responses go on).
    fn settle(&self, number: u64, state: State) -> bool {
        let mut queue = self.queue();
        if queue.gone {
            return false;
        }
        let Some(index) = number.checked_sub(queue.front) else {
            return false;
        };
        if let Some(entry) = queue.places.get_mut(index as usize) {
            entry.state = state;
        }
        index == 0
    }
}

impl Place {
    /// Closes the connection after the answers to the requests before this
    /// one (those after it get none).
    pub(super) fn close(mut self) {
        self.filled = true;
        if self.responses.settle(self.number, State::Close) {
            self.responses.wake.notify_one();
        }
    }

    /// Fills the place with the request's response (`None`: no response).
    /// The front place's response is written here, with those after it that
    /// are ready, unless the writer task is writing (then it is woken).
    pub(super) async fn fill(mut self, response: Option<Response>) {
        self.filled = true;
        let responses = &self.responses;
        if !responses.settle(self.number, State::Filled(response)) {
            return;
        }
        let Ok(mut out) = responses.out.try_lock() else {
            responses.wake.notify_one();
            return;
        };
        // Boxed: a request's task holds this future; see
        // `a_request_task_stays_small`.
        match Box::pin(responses.drain(&mut out)).await {
            Drained::Waiting => {}
            // The writer task ends the connection's writing.
            Drained::Failed => {
                drop(out);
                responses.stop();
                responses.wake.notify_one();
            }
            Drained::End | Drained::Abandoned | Drained::Closed => {
                drop(out);
                responses.wake.notify_one();
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.filled && self.responses.settle(self.number, State::Abandoned) {
            self.responses.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, DuplexStream};

    use super::*;

    fn response(text: &'static str) -> Option<Response> {
        Some(Response::bare(vec![Bytes::from_static(text.as_bytes())]))
    }

    /// Responses writing to one end of a pipe, and the other end.
    fn responses(max_inflight: usize) -> (Arc<Responses>, DuplexStream) {
        let (write, read) = tokio::io::duplex(1 << 16);
        (Responses::new(max_inflight, Duration::from_secs(60), write), read)
    }

    /// What was written so far.
    async fn written(read: &mut DuplexStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(Ok(n)) =
            tokio::time::timeout(std::time::Duration::from_millis(20), read.read(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).expect("text")
    }

    #[tokio::test]
    async fn responses_leave_in_request_order_whatever_order_they_are_filled_in() {
        let (responses, mut read) = responses(8);
        let first = responses.place().await.expect("room");
        let second = responses.place().await.expect("room");
        let third = responses.place().await.expect("room");
        let fourth = responses.place().await.expect("room");
        third.fill(response("c")).await;
        second.fill(None).await;
        assert_eq!(written(&mut read).await, "", "the first is not answered yet");
        // The first one's task writes it, the acks=0 produce's nothing, and
        // the third's answer.
        first.fill(response("a")).await;
        assert_eq!(written(&mut read).await, "ac");
        assert!(matches!(responses.front(), Front::Waiting));
        fourth.fill(response("d")).await;
        assert_eq!(written(&mut read).await, "d");
        responses.close();
        assert!(matches!(responses.front(), Front::End));
    }

    /// The task that fills the front place writes it: the writer is not
    /// woken. While the writer writes, it is woken instead; filling a
    /// later place wakes nobody.
    #[tokio::test]
    async fn the_front_is_written_by_its_task_unless_the_writer_is_writing() {
        let (responses, mut read) = responses(8);
        let first = responses.place().await.expect("room");
        let second = responses.place().await.expect("room");
        let third = responses.place().await.expect("room");
        let changed = responses.changed();
        tokio::pin!(changed);
        assert!(futures::poll!(&mut changed).is_pending());
        second.fill(response("b")).await;
        assert!(futures::poll!(&mut changed).is_pending(), "a later place filled");
        first.fill(response("a")).await;
        assert!(futures::poll!(&mut changed).is_pending(), "written by its task");
        assert_eq!(written(&mut read).await, "ab");
        let writing = responses.out.lock().await;
        third.fill(response("c")).await;
        assert!(futures::poll!(&mut changed).is_ready(), "the writer is woken");
        drop(writing);
        let mut out = responses.out.lock().await;
        assert!(matches!(responses.drain(&mut out).await, Drained::Waiting));
        drop(out);
        assert_eq!(written(&mut read).await, "c");
    }

    #[tokio::test]
    async fn a_wake_before_the_writer_waits_is_kept() {
        let (responses, _read) = responses(8);
        let place = responses.place().await.expect("room");
        assert!(matches!(responses.front(), Front::Waiting));
        let writing = responses.out.lock().await;
        place.fill(response("a")).await;
        drop(writing);
        // The writer looked, then the place filled, then it waits.
        tokio::time::timeout(std::time::Duration::from_secs(5), responses.changed())
            .await
            .expect("the wake was kept");
    }

    #[tokio::test]
    async fn a_place_dropped_unfilled_is_abandoned() {
        let (responses, _read) = responses(8);
        let place = responses.place().await.expect("room");
        let changed = responses.changed();
        tokio::pin!(changed);
        assert!(futures::poll!(&mut changed).is_pending());
        drop(place);
        assert!(futures::poll!(&mut changed).is_ready(), "the writer is woken");
        assert!(matches!(responses.front(), Front::Abandoned));
    }

    /// A client that stopped reading: its task's write fails, the
    /// responses stop, and the reader admits no more.
    #[tokio::test]
    async fn a_failed_write_stops_the_responses() {
        let (responses, read) = responses(8);
        drop(read);
        let place = responses.place().await.expect("room");
        place.fill(response("a")).await;
        assert!(matches!(responses.front(), Front::End));
        assert!(responses.place().await.is_none());
    }

    #[tokio::test]
    async fn the_reader_waits_for_room_and_stops_when_the_writer_does() {
        let (responses, mut read) = responses(2);
        let first = responses.place().await.expect("room");
        let second = responses.place().await.expect("room");
        let third = responses.place();
        tokio::pin!(third);
        assert!(futures::poll!(&mut third).is_pending(), "two places are the most");
        second.fill(response("b")).await;
        assert!(
            futures::poll!(&mut third).is_pending(),
            "room comes back when a response is written"
        );
        first.fill(response("a")).await;
        assert_eq!(written(&mut read).await, "ab");
        assert!(matches!(
            futures::poll!(&mut third),
            std::task::Poll::Ready(Some(_))
        ));
        responses.stop();
        assert!(
            responses.place().await.is_none(),
            "no places once the writer has stopped"
        );
        assert!(!responses.answer(Bytes::from_static(b"x")).await);
    }
}
