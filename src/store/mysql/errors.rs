//! MySQL's errors in the store's terms.

use crate::store::StoreError;

/// MySQL's errors in the store's terms: a statement the server cannot run on this schema
/// (no such table or column, a syntax error) will fail again; anything else (connection
/// lost, deadlock, lock wait timeout, server gone) may succeed when retried.
impl From<mysql_async::Error> for StoreError {
    fn from(e: mysql_async::Error) -> StoreError {
        // Statements this build should never send, or data it should never write:
        // duplicate key, syntax, unknown column or table, too long, wrong value, out of
        // range.
        const CORRUPT: [u16; 7] = [1062, 1064, 1054, 1146, 1406, 1366, 1264];
        // The server refuses this user or has no such database: configuration.
        const SCHEMA: [u16; 4] = [1044, 1045, 1049, 1142];
        match &e {
            mysql_async::Error::Server(s) if CORRUPT.contains(&s.code) => {
                StoreError::Corrupt(format!("mysql: {e}"))
            }
            mysql_async::Error::Server(s) if SCHEMA.contains(&s.code) => {
                StoreError::Schema(format!("mysql: {e}"))
            }
            // The connection broke, or the server ended it (KILL CONNECTION at a fence,
            // a shutdown) mid-statement: whatever was sent may have committed (a commit
            // waiting for a semi-sync acknowledgement is binlogged already). (A connect
            // that fails is made Transient where connections are taken.)
            mysql_async::Error::Io(_) => StoreError::Lost(format!("mysql: {e}")),
            mysql_async::Error::Server(s) if s.code == 1927 || s.code == 1053 => {
                StoreError::Lost(format!("mysql: {e}"))
            }
            _ => StoreError::Transient(format!("mysql: {e}")),
        }
    }
}

/// The server said the database does not exist (1049), as the conversion above wrote it
/// (``mysql: Server error: `ERROR 42000 (1049): Unknown database 'x''``).
pub(super) fn is_unknown_database(e: &StoreError) -> bool {
    matches!(e, StoreError::Schema(m) if m.contains(" (1049): Unknown database"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "x".into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn mysql_errors_are_transient_unless_no_retry_can_fix_them() {
        // Deadlock, lock wait timeout: retry.
        assert!(matches!(
            StoreError::from(server(1213)),
            StoreError::Transient(_)
        ));
        assert!(matches!(
            StoreError::from(server(1205)),
            StoreError::Transient(_)
        ));
        // No such table, unknown column: the schema is not this build's.
        assert!(matches!(
            StoreError::from(server(1146)),
            StoreError::Corrupt(_)
        ));
        assert!(matches!(
            StoreError::from(server(1054)),
            StoreError::Corrupt(_)
        ));
    }

    #[test]
    fn a_missing_database_is_told_from_other_refusals() {
        let unknown = mysql_async::Error::Server(mysql_async::ServerError {
            code: 1049,
            message: "Unknown database 'foqs_shard_0'".into(),
            state: "42000".into(),
        });
        assert!(is_unknown_database(&StoreError::from(unknown)));
        assert!(
            !is_unknown_database(&StoreError::from(server(1049))),
            "another text"
        );
        assert!(!is_unknown_database(&StoreError::from(server(1045))));
        assert!(!is_unknown_database(&StoreError::from(server(1044))));
    }
}
