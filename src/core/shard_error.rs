//! The one place a shard's failure becomes the API's error: retryable `UNAVAILABLE`, or
//! `INTERNAL` for storage that holds what this build cannot use.

use crate::error::{Error, ErrorCode};
use crate::shard::ShardError;

impl From<ShardError> for Error {
    fn from(e: ShardError) -> Error {
        if e.in_doubt() {
            Error::in_doubt(format!("{e} (its outcome is unknown)"))
        } else if e.retryable() {
            Error::unavailable(e.to_string())
        } else {
            Error::new(ErrorCode::Internal, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn only_storage_that_no_retry_can_fix_is_internal() {
        let corrupt = Error::from(ShardError::Storage {
            shard: 3,
            error: StoreError::Corrupt("unknown state 9".into()),
        });
        assert_eq!(
            (corrupt.code, corrupt.retryable),
            (ErrorCode::Internal, false)
        );
        assert!(corrupt.message.contains("shard 3"), "{}", corrupt.message);
        for e in [
            ShardError::Busy {
                shard: 3,
                why: "its queue is full".into(),
            },
            ShardError::NoAnswer {
                shard: 3,
                waited_ms: 800,
            },
            ShardError::Gone(3),
            ShardError::Storage {
                shard: 3,
                error: StoreError::Fenced,
            },
        ] {
            let e = Error::from(e);
            assert_eq!(
                (e.code, e.retryable),
                (ErrorCode::Unavailable, true),
                "{e:?}"
            );
        }
    }
}
