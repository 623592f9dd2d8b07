//! Request decoding and handler dispatch: a sequence of request frames
//! answered by one gateway over in-memory storage
//! (`ketch_gateway::fuzzing::requests`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ketch_gateway::fuzzing::requests(data);
});
