//! Record-batch validation and decompression: an accepted batch must read
//! back completely (`ketch_storage::fuzzing::batch`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ketch_storage::fuzzing::batch(data);
});
