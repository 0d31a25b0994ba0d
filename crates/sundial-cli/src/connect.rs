//! How a client command reaches the server: the bearer token (`--token`, `SUNDIAL_TOKEN`). Every client command flattens [`Credentials`] into its arguments and builds
//! its HTTP client with [`Credentials::http_builder`].

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};

/// What a client command sends to prove who it is, and whom it trusts.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Credentials {
    /// Bearer token (from `sundial token create`); needed when the server has auth on.
    #[arg(long, env = "SUNDIAL_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
}

/// Why a client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the token is not a valid header value")]
    BadToken,
}

impl Credentials {
    /// Credentials with just a token.
    pub fn token(token: impl Into<String>) -> Self {
        Credentials {
            token: Some(token.into()),
        }
    }

    /// The `Authorization` header to send, if any.
    pub fn headers(&self) -> Result<HeaderMap, ConnectError> {
        let mut headers = HeaderMap::new();
        if let Some(t) = self
            .token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|_| ConnectError::BadToken)?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        Ok(headers)
    }

    /// A client builder that sends the token on every request.
    pub fn http_builder(&self) -> Result<reqwest::ClientBuilder, ConnectError> {
        Ok(crate::client::http_client_builder().default_headers(self.headers()?))
    }
}
