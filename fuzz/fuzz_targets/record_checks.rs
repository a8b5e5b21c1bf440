//! A check shared by the targets of formats whose containers store a CRC per record.

use tensorwire_core::TensorSource;

/// Every record that `verify` passes, `check_record_at` (what copies and `convert`
/// call first) passes too; a position past the end is an error.
pub fn assert_record_checks_agree_with_verify(source: &dyn TensorSource) {
    let count = source.tensors().len();
    let checked: Vec<bool> = (0..count)
        .map(|at| source.check_record_at(at).is_ok())
        .collect();
    if source.verify().is_ok() {
        assert!(
            checked.iter().all(|&ok| ok),
            "verify passes but a record's check fails"
        );
    }
    assert!(source.check_record_at(count).is_err());
}
