//! The domain error: a stable [`ErrorCode`] (the same numbers as the IDL's `ErrorCode`), a
//! message for humans and whether retrying may help. Converted to Thrift once, in `rpc`.

/// Stable error codes; the numbers are part of the wire contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument = 1,
    PayloadTooLarge = 2,
    RateLimited = 3,
    Unavailable = 4,
    NotFound = 5,
    WrongHost = 6,
    UnknownNamespace = 7,
    Internal = 8,
    PermissionDenied = 9,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
    /// "host:port" of the host that can serve the request (`WRONG_HOST`).
    pub redirect: Option<String>,
    /// The change may have been applied: it went out (to storage, or to the owning host)
    /// and no answer came back within its bound. On the wire as `outcome_unknown`; a
    /// forwarded ack in doubt is resolved before the reply (see `core::in_doubt`).
    pub in_doubt: bool,
    /// `RATE_LIMITED`: how long to wait before retrying (a hint). On the wire as
    /// `retry_after_ms`.
    pub retry_after_ms: Option<u64>,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        // Only transient conditions are worth retrying unchanged.
        let retryable = matches!(code, ErrorCode::Unavailable | ErrorCode::RateLimited);
        Error {
            code,
            message: message.into(),
            retryable,
            redirect: None,
            in_doubt: false,
            retry_after_ms: None,
        }
    }

    pub fn wrong_host(message: impl Into<String>, addr: &str) -> Self {
        Error {
            redirect: Some(addr.to_string()),
            ..Error::new(ErrorCode::WrongHost, message)
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::InvalidArgument, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Unavailable, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::NotFound, message)
    }

    /// `RATE_LIMITED`, with a hint of when to retry.
    pub fn rate_limited(message: impl Into<String>, retry_after_ms: u64) -> Self {
        Error {
            retry_after_ms: Some(retry_after_ms),
            ..Error::new(ErrorCode::RateLimited, message)
        }
    }

    /// `UNAVAILABLE`, marked as sent with its outcome unknown.
    pub fn in_doubt(message: impl Into<String>) -> Self {
        Error {
            in_doubt: true,
            ..Error::unavailable(message)
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// What a call's error adds when the call reached its peer and no answer came back: it may
/// have been applied. A resolution that settles the doubt drops it from the message.
pub const SENT_OUTCOME_UNKNOWN: &str = " (the call was sent: its outcome is unknown)";
