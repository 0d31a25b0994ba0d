//! `SUNDIAL_BOOTSTRAP_TOKEN`: the first admin token, chosen by the operator, stored by
//! `sundial server` when it starts.
//!
//! The value is a whole bearer token in the form the server issues (`sdl_` + 32 hex digits of
//! token id + 64 of secret; `sdl_$(openssl rand -hex 48)` makes one). At start the server stores
//! it, as the SHA-256 of its secret like every token, as an admin token named [`NAME`], only
//! when the store holds no token at all ([`AccessStore::create_first_token`], one atomic step,
//! so nodes starting together on one PostgreSQL store at most one token between them). When any
//! token exists the variable is ignored with an info line, so a restart that still sets it is
//! harmless. A value that is not such a token stops the server before it binds or opens
//! anything; an empty one counts as unset.

use sundial::{AccessStore, NewToken, Scope, StoreError, Timestamp, TokenId};
use sundial_server::access::{TOKEN_PREFIX, hash_secret, parse_token};

/// The environment variable.
pub const ENV: &str = "SUNDIAL_BOOTSTRAP_TOKEN";
/// The stored token's name.
pub const NAME: &str = "bootstrap";

/// A bootstrap token's id and the hash of its secret (the secret itself is not kept).
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: TokenId,
    pub secret_hash: [u8; 32],
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Reads [`ENV`]: `None` when unset or empty.
pub fn from_env() -> Result<Option<BootstrapToken>, String> {
    match std::env::var_os(ENV) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            None => Err(format!("{ENV} is not valid UTF-8")),
            Some(s) if s.trim().is_empty() => Ok(None),
            Some(s) => parse(s).map(Some),
        },
    }
}

/// Checks a bootstrap token's form. The message never repeats the value (it is a secret).
pub fn parse(value: &str) -> Result<BootstrapToken, String> {
    let value = value.trim();
    let (id, secret) = parse_token(value).ok_or_else(|| {
        let got = if !value.starts_with(TOKEN_PREFIX) {
            format!("it does not start with {TOKEN_PREFIX:?}")
        } else {
            format!(
                "it has {} characters after {TOKEN_PREFIX:?}",
                value.len() - TOKEN_PREFIX.len()
            )
        };
        format!(
            "{ENV} is not a Sundial token: {got}; it must be {TOKEN_PREFIX:?} followed by 96 \
             lowercase or uppercase hex digits (make one with: echo {TOKEN_PREFIX}$(openssl rand -hex 48))"
        )
    })?;
    Ok(BootstrapToken {
        id,
        secret_hash: hash_secret(&secret),
    })
}

/// What [`store`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The store had no token: this one is now its admin token.
    Stored,
    /// Tokens existed already: nothing was stored.
    TokensExist,
}

/// Stores `token` as the admin token [`NAME`] when `store` holds no token.
pub async fn store(
    store: &dyn AccessStore,
    token: &BootstrapToken,
    now: Timestamp,
) -> Result<Outcome, StoreError> {
    let new = NewToken {
        id: token.id,
        name: NAME.to_string(),
        scope: Scope::Admin,
        namespace: None,
        secret_hash: token.secret_hash,
        created_at: now,
        expires_at: None,
    };
    Ok(match store.create_first_token(new).await? {
        Some(_) => Outcome::Stored,
        None => Outcome::TokensExist,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_of_the_issued_form_is_accepted() {
        let issued = sundial_server::access::IssuedToken::generate();
        let t = parse(&issued.token).expect("an issued token");
        assert_eq!(t.id, issued.id);
        assert_eq!(t.secret_hash, issued.secret_hash);
        // A trailing newline (from a file) is not part of it.
        assert_eq!(parse(&format!("{}\n", issued.token)), Ok(t));
    }

    #[test]
    fn malformed_values_are_refused_without_repeating_them() {
        let issued = sundial_server::access::IssuedToken::generate();
        let short = &issued.token[..issued.token.len() - 1];
        let not_hex = format!("{}g", short);
        for bad in [
            "secret",
            "sdl_",
            short,
            not_hex.as_str(),
            &issued.token[4..],
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(ENV) && e.contains("sdl_"), "{e}");
            if bad.len() > 8 {
                assert!(!e.contains(bad), "the message repeats the value: {e}");
            }
        }
    }
}
