//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>).
//!
//! A secret is `whsec_` followed by the base64 of its key bytes. The signed content is
//! `{webhook-id}.{webhook-timestamp}.{body}`; a signature is `v1,` and the base64 of its
//! HMAC-SHA256 under the key. During a rotation two (or more) secrets are active and the
//! `webhook-signature` header carries one signature per secret, separated by spaces, so a
//! receiver holding either secret accepts the call.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;
use thiserror::Error;

/// The prefix of every secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Key length of generated secrets.
pub const GENERATED_KEY_BYTES: usize = 32;
const MIN_KEY_BYTES: usize = 24;
const MAX_KEY_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SecretError {
    #[error("a signing secret starts with {SECRET_PREFIX}")]
    Prefix,
    #[error("a signing secret is {SECRET_PREFIX} and base64: {0}")]
    Base64(String),
    #[error("a signing secret's key is {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes; this one is {0}")]
    Length(usize),
}

/// A signing secret's key.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey {
    key: Vec<u8>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(…)")
    }
}

impl SigningKey {
    /// Parses `whsec_<base64>`.
    pub fn parse(secret: &str) -> Result<Self, SecretError> {
        let b64 = secret
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::Prefix)?;
        let key = STANDARD
            .decode(b64)
            .map_err(|e| SecretError::Base64(e.to_string()))?;
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(SigningKey { key })
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_KEY_BYTES];
        rand::rng().fill_bytes(&mut key);
        SigningKey { key }
    }

    /// The `whsec_…` form.
    pub fn to_secret_string(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.key))
    }

    /// `v1,<base64 HMAC-SHA256 of id.timestamp.body>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // new_from_slice accepts keys of any length for HMAC.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.key) {
            Ok(m) => m,
            Err(_) => unreachable_hmac(),
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cold]
fn unreachable_hmac() -> ! {
    // HMAC is defined for every key length (long keys are hashed first); the error case of
    // `new_from_slice` exists for MACs that are not.
    panic!("HMAC refused a key")
}

/// The `webhook-signature` header value: one `v1,` signature per key, space separated.
pub fn signature_header(keys: &[SigningKey], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|k| k.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_specification_example() {
        // The example of the Standard Webhooks reference libraries.
        let key = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let sig = key.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn secrets_round_trip_and_are_checked() {
        let k = SigningKey::generate();
        let s = k.to_secret_string();
        assert!(s.starts_with("whsec_"));
        assert_eq!(SigningKey::parse(&s).expect("parse"), k);
        assert_eq!(SigningKey::parse("abc"), Err(SecretError::Prefix));
        assert!(matches!(
            SigningKey::parse("whsec_!!!"),
            Err(SecretError::Base64(_))
        ));
        assert_eq!(SigningKey::parse("whsec_AAAA"), Err(SecretError::Length(3)));
    }

    #[test]
    fn two_keys_two_signatures() {
        let a = SigningKey::generate();
        let b = SigningKey::generate();
        let h = signature_header(&[a.clone(), b.clone()], "id", 5, b"x");
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts, vec![a.sign("id", 5, b"x"), b.sign("id", 5, b"x")]);
    }
}
