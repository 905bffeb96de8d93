//! Who is looking: HTTP basic auth against `[[console.users]]` (Argon2 PHC hashes), and
//! the role that decides whether they may change anything.
//!
//! Argon2 is slow on purpose (tens of milliseconds), and a console page polls every few
//! seconds with basic auth on every request; credentials that verified once are remembered
//! by their SHA-256 digest (never the password itself), so a poll costs a hash lookup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argon2::password_hash::{PasswordHash, PasswordVerifier};
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::config::{ConsoleRole, ConsoleUser};

/// Verified credentials remembered at most; past it the memory starts over.
const VERIFIED_MAX: usize = 256;

pub struct Users {
    users: Vec<ConsoleUser>,
    verified: Mutex<HashMap<[u8; 32], ConsoleRole>>,
    /// Argon2 runs at once, at most: each takes tens of milliseconds of CPU, on the
    /// blocking pool, so wrong passwords sent in a flood cannot stall the host's requests.
    hashing: Arc<tokio::sync::Semaphore>,
    /// Argon2 runs at once per client address: one address cannot take every place (two
    /// wrong passwords sent at once locked out every login while they were checked).
    by_source: Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Verified for a name no user has, so that a refusal costs the same either way.
    dummy: String,
}

/// Argon2 verifications running at once, at most.
const HASHING_MAX: usize = 4;
/// The same for one client address.
const HASHING_PER_SOURCE_MAX: usize = 1;

/// What a request's credentials amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Anyone may (no users configured): as admin.
    Open,
    User(ConsoleRole),
    /// No credentials, or wrong ones: ask again (401).
    Refused,
    /// Too many logins are being checked at once: try again (503).
    Busy,
}

impl Verdict {
    pub fn may_change(self) -> bool {
        matches!(self, Verdict::Open | Verdict::User(ConsoleRole::Admin))
    }
}

impl Users {
    pub fn new(users: Vec<ConsoleUser>) -> Users {
        // The same cost as the users' hashes (the first one's), for unknown names.
        let (m, t) = users
            .first()
            .and_then(|u| PasswordHash::new(&u.password_hash).ok())
            .and_then(|h| argon2::Params::try_from(&h).ok())
            .map_or((64, 1), |p| (p.m_cost(), p.t_cost()));
        let dummy = if users.is_empty() {
            String::new()
        } else {
            hash_password("not a password anyone has", m, t).unwrap_or_default()
        };
        Users {
            users,
            verified: Mutex::new(HashMap::new()),
            hashing: Arc::new(tokio::sync::Semaphore::new(HASHING_MAX)),
            by_source: Mutex::new(HashMap::new()),
            dummy,
        }
    }

    /// Checks an `Authorization` header's value (absent: none sent) from `source`, the
    /// client's address when known.
    pub async fn verify(
        &self,
        authorization: Option<&str>,
        source: Option<std::net::IpAddr>,
    ) -> Verdict {
        if self.users.is_empty() {
            return Verdict::Open;
        }
        let Some(value) = authorization else {
            return Verdict::Refused;
        };
        let digest: [u8; 32] = Sha256::digest(value.as_bytes()).into();
        if let Some(role) = self.verified.lock().expect("not poisoned").get(&digest) {
            return Verdict::User(*role);
        }
        let Some((name, password)) = parse_basic(value) else {
            return Verdict::Refused;
        };
        let user = self.users.iter().find(|u| u.name == name);
        let hash = user.map_or(self.dummy.clone(), |u| u.password_hash.clone());
        // At most HASHING_MAX at once, held by the hashing itself (a request dropped
        // mid-way does not free its place early); past it, come back later.
        let Some(_source) = SourceSlot::take(&self.by_source, source) else {
            return Verdict::Busy;
        };
        let Ok(permit) = self.hashing.clone().try_acquire_owned() else {
            return Verdict::Busy;
        };
        // Argon2's own comparison of the computed hash is constant-time.
        let ok = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            PasswordHash::new(&hash).is_ok_and(|h| {
                argon2::Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
        })
        .await
        .unwrap_or(false);
        let (Some(u), true) = (user, ok) else {
            return Verdict::Refused;
        };
        let mut v = self.verified.lock().expect("not poisoned");
        if v.len() >= VERIFIED_MAX {
            v.clear();
        }
        v.insert(digest, u.role);
        Verdict::User(u.role)
    }
}

/// A client address's place among the Argon2 verifications running, given back on drop.
struct SourceSlot<'a> {
    map: &'a Mutex<HashMap<std::net::IpAddr, usize>>,
    source: Option<std::net::IpAddr>,
}

impl<'a> SourceSlot<'a> {
    /// `None` when `source` has `HASHING_PER_SOURCE_MAX` running already.
    fn take(
        map: &'a Mutex<HashMap<std::net::IpAddr, usize>>,
        source: Option<std::net::IpAddr>,
    ) -> Option<SourceSlot<'a>> {
        if let Some(ip) = source {
            let mut m = map.lock().expect("not poisoned");
            let n = m.entry(ip).or_default();
            if *n >= HASHING_PER_SOURCE_MAX {
                return None;
            }
            *n += 1;
        }
        Some(SourceSlot { map, source })
    }
}

impl Drop for SourceSlot<'_> {
    fn drop(&mut self) {
        if let Some(ip) = self.source {
            let mut m = self.map.lock().expect("not poisoned");
            if let Some(n) = m.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&ip);
                }
            }
        }
    }
}

/// `Basic base64(name:password)` → (name, password).
fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (n, p) = text.split_once(':')?;
    Some((n.to_string(), p.to_string()))
}

/// An Argon2id hash of `password` in PHC format with a random salt and the given cost
/// (`m_kib` memory, `t` passes): what `foqsctl hash-password` prints.
pub fn hash_password(password: &str, m_kib: u32, t: u32) -> Result<String, String> {
    use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
    let params = argon2::Params::new(m_kib, t, 1, None).map_err(|e| e.to_string())?;
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let salt = SaltString::generate(&mut OsRng);
    a.hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(n: &str, p: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{n}:{p}"))
        )
    }

    #[tokio::test]
    async fn users_are_told_apart_by_name_password_and_role() {
        let users = Users::new(vec![
            ConsoleUser {
                name: "ops".into(),
                password_hash: hash_password("s3cret", 64, 1).unwrap(),
                role: ConsoleRole::Admin,
            },
            ConsoleUser {
                name: "viewer".into(),
                password_hash: hash_password("look", 64, 1).unwrap(),
                role: ConsoleRole::ReadOnly,
            },
        ]);
        assert_eq!(users.verify(None, None).await, Verdict::Refused);
        assert_eq!(users.verify(Some("Bearer x"), None).await, Verdict::Refused);
        assert_eq!(
            users.verify(Some(&header("ops", "s3cret")), None).await,
            Verdict::User(ConsoleRole::Admin)
        );
        // Remembered: the same answer again, from the cache.
        assert_eq!(
            users.verify(Some(&header("ops", "s3cret")), None).await,
            Verdict::User(ConsoleRole::Admin)
        );
        assert_eq!(
            users.verify(Some(&header("ops", "wrong")), None).await,
            Verdict::Refused
        );
        // The other user's password under this user's name is refused.
        assert_eq!(
            users.verify(Some(&header("ops", "look")), None).await,
            Verdict::Refused
        );
        let viewer = users.verify(Some(&header("viewer", "look")), None).await;
        assert_eq!(viewer, Verdict::User(ConsoleRole::ReadOnly));
        assert!(!viewer.may_change());
        assert!(Users::new(vec![]).verify(None, None).await.may_change());
        // A name nobody has is refused (after the same work as a wrong password).
        assert_eq!(
            users.verify(Some(&header("nobody", "look")), None).await,
            Verdict::Refused
        );
        // Every hashing place taken: a new login is told to come back, one already
        // verified is still let in (from memory).
        let _taken: Vec<_> = (0..HASHING_MAX)
            .map(|_| users.hashing.clone().try_acquire_owned().unwrap())
            .collect();
        assert_eq!(
            users.verify(Some(&header("ops", "other")), None).await,
            Verdict::Busy
        );
        assert_eq!(
            users.verify(Some(&header("ops", "s3cret")), None).await,
            Verdict::User(ConsoleRole::Admin)
        );
    }

    #[tokio::test]
    async fn one_address_checking_a_password_does_not_lock_out_another() {
        let users = Users::new(vec![ConsoleUser {
            name: "ops".into(),
            password_hash: hash_password("s3cret", 64, 1).unwrap(),
            role: ConsoleRole::Admin,
        }]);
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // A's first wrong password is being checked: its second waits its turn...
        let held = SourceSlot::take(&users.by_source, Some(a)).unwrap();
        assert_eq!(
            users.verify(Some(&header("ops", "guess")), Some(a)).await,
            Verdict::Busy
        );
        // ...and B logs in meanwhile. (Before: two places for every address.)
        assert_eq!(
            users.verify(Some(&header("ops", "s3cret")), Some(b)).await,
            Verdict::User(ConsoleRole::Admin)
        );
        drop(held);
        assert_eq!(
            users.verify(Some(&header("ops", "guess")), Some(a)).await,
            Verdict::Refused
        );
        assert!(users.by_source.lock().unwrap().is_empty());
    }
}
