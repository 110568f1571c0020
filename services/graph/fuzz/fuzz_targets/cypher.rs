//! libFuzzer entry: every input goes through parse + validate + rewrite + verify.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kg_graph_fuzz::check(data);
});
