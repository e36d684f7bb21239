//! Compile errors a user meets, checked for what they say: a layer whose inner service's body
//! cannot carry the layer's own answers names `.wrap_body()`; a client whose answers the
//! pushback cannot read names `ResponseHead` and the reqwest major it speaks.

#[test]
fn a_body_that_cannot_carry_answers_names_the_fix() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/body_without_bytes.rs");
    cases.compile_fail("tests/ui/response_without_head.rs");
}
