//! Encoding of everything Leasehold stores or sends between nodes: postcard behind a
//! one-byte format version, so that a future format can be told apart from this one
//! instead of being misread.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The format version written in front of every stored blob and peer message. 2:
/// log entries carry each command's caller, sessions their tenant and secret, and
/// the state its tenants.
pub const FORMAT_VERSION: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty blob: expected a format version byte")]
    Empty,
    #[error("format version {found} is not supported (this build reads version {FORMAT_VERSION})")]
    UnsupportedVersion { found: u8 },
    #[error("malformed blob: {0}")]
    Malformed(#[from] postcard::Error),
}

pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    // Encoded straight behind the version byte: a snapshot is one buffer, not two.
    // postcard only fails on a writer that runs out of room; a Vec never does.
    postcard::to_extend(value, vec![FORMAT_VERSION]).expect("postcard encoding into a Vec cannot fail")
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(postcard::from_bytes(versioned_body(bytes)?)?)
}

/// A buffer holding the format version, for a blob encoded by other means.
pub fn versioned_buffer() -> Vec<u8> {
    vec![FORMAT_VERSION]
}

/// The body of a blob after its format version, checked.
pub fn versioned_body(bytes: &[u8]) -> Result<&[u8], CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion { found: version });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_other_versions() {
        let bytes = encode(&(7u64, "lock".to_string()));
        assert_eq!(bytes[0], FORMAT_VERSION);
        let back: (u64, String) = decode(&bytes).unwrap();
        assert_eq!(back, (7, "lock".to_string()));

        let mut other = bytes.clone();
        other[0] = FORMAT_VERSION + 1;
        assert!(matches!(decode::<(u64, String)>(&other), Err(CodecError::UnsupportedVersion { .. })));
        assert!(matches!(decode::<(u64, String)>(&[]), Err(CodecError::Empty)));
        assert!(matches!(decode::<(u64, String)>(&[FORMAT_VERSION, 0xff]), Err(CodecError::Malformed(_))));
    }
}
