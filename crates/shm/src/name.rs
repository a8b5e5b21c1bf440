//! Segment names: checked before they reach `shm_open`.

use tensorwire_core::{Error, Result};

/// Longest segment name accepted, in bytes (`NAME_MAX` less the leading `/` that
/// `shm_open` needs).
pub const MAX_NAME_BYTES: usize = 254;

/// Checks a segment name as users write it (`"my_cache"`, no leading slash): 1 to
/// [`MAX_NAME_BYTES`] bytes, no `/` and no NUL. Python's `SharedMemory` uses the same
/// names, so a segment made here can be opened there and the other way round.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("a shared-memory name cannot be empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(format!(
            "shared-memory name is {} bytes, above the limit of {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    if name.contains('/') {
        return Err(Error::invalid(format!(
            "shared-memory name {name:?} contains '/' (give the bare name, e.g. \"my_cache\")"
        )));
    }
    if name.contains('\0') {
        return Err(Error::invalid("shared-memory name contains a NUL byte"));
    }
    if name == "." || name == ".." {
        return Err(Error::invalid(format!(
            "shared-memory name {name:?} is reserved"
        )));
    }
    Ok(())
}

/// The path `shm_open` takes for a checked name.
pub(crate) fn posix_path(name: &str) -> Result<std::ffi::CString> {
    check_name(name)?;
    std::ffi::CString::new(format!("/{name}"))
        .map_err(|_| Error::invalid("shared-memory name contains a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("tw_cache-1.x").is_ok());
        assert!(check_name(&"a".repeat(MAX_NAME_BYTES)).is_ok());
        for bad in ["", "a/b", "/lead", "nul\0", ".", ".."] {
            let err = check_name(bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{bad:?}: {err}"
            );
        }
        let err = check_name(&"a".repeat(MAX_NAME_BYTES + 1)).unwrap_err();
        assert!(err.to_string().contains("above the limit"), "{err}");
        assert_eq!(posix_path("x").unwrap().as_bytes(), b"/x");
    }
}
