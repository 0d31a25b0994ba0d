//! How a client command reaches the server: the bearer token (`--token`, `SUNDIAL_TOKEN`) and the
//! certificate authorities trusted besides the system's (`--ca-file`, `SUNDIAL_CA_FILE`: a
//! server whose certificate a private CA signed). Every client command flattens
//! [`Credentials`] into its arguments and builds its HTTP client with
//! [`Credentials::http_builder`].

use std::path::{Path, PathBuf};

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};

/// What a client command sends to prove who it is, and whom it trusts.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Credentials {
    /// Bearer token (from `sundial token create`); needed when the server has auth on.
    #[arg(long, env = "SUNDIAL_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file of CA certificates to trust besides the system's, for a server whose HTTPS
    /// certificate a private CA signed.
    #[arg(long, env = "SUNDIAL_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// The namespace to act in (set from [`NamespaceArg`] by the commands that act in one).
    #[arg(skip)]
    pub namespace: Option<String>,
}

/// `--namespace` / `SUNDIAL_NAMESPACE`: the namespace a command acts in (default: `default`);
/// its requests go to `/v1/namespaces/{ns}/…`. Flattened into the commands of a namespace's
/// API (not the admin ones, whose own `--namespace` means something else).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NamespaceArg {
    /// The namespace to act in (default: `default`).
    #[arg(long, env = "SUNDIAL_NAMESPACE", global = true)]
    pub namespace: Option<String>,
}

impl Credentials {
    /// These credentials acting in the namespace `ns` names.
    pub fn in_namespace(mut self, ns: &NamespaceArg) -> Self {
        self.namespace = ns.namespace.clone();
        self
    }
}

/// Routes every namespace shares (tokens, namespaces, the audit log): never under a namespace.
const SHARED_ROUTES: &[&str] = &["/v1/tokens", "/v1/namespaces", "/v1/audit"];

/// The path of an API route in namespace `ns`: `/v1/tasks` in `acme` is
/// `/v1/namespaces/acme/tasks`. The default namespace (or none) and the routes all namespaces
/// share keep their path.
pub fn in_namespace(ns: Option<&str>, path: &str) -> String {
    match (ns, path.strip_prefix("/v1/")) {
        (Some(ns), Some(rest))
            if ns != "default" && !SHARED_ROUTES.iter().any(|r| path.starts_with(r)) =>
        {
            format!("/v1/namespaces/{ns}/{rest}")
        }
        _ => path.to_string(),
    }
}

/// Why a client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the token is not a valid header value")]
    BadToken,
    #[error("cannot read the CA file {}: {source}", path.display())]
    ReadCaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA file {} is not PEM certificates: {source}", path.display())]
    ParseCaFile {
        path: PathBuf,
        #[source]
        source: reqwest::Error,
    },
    #[error("the CA file {} holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")", path.display())]
    EmptyCaFile { path: PathBuf },
}

/// The certificates of a PEM file (one or more `CERTIFICATE` blocks; anything else in the file is
/// ignored). A file that cannot be read, or holds no certificate, is an error naming it.
pub fn read_ca_file(path: &Path) -> Result<Vec<reqwest::Certificate>, ConnectError> {
    let pem = std::fs::read(path).map_err(|source| ConnectError::ReadCaFile {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
        ConnectError::ParseCaFile {
            path: path.to_path_buf(),
            source,
        }
    })?;
    if certs.is_empty() {
        return Err(ConnectError::EmptyCaFile {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

impl Credentials {
    /// Credentials with just a token.
    pub fn token(token: impl Into<String>) -> Self {
        Credentials {
            token: Some(token.into()),
            ..Credentials::default()
        }
    }

    /// The path of an API route in the chosen namespace (see [`in_namespace`]).
    pub fn path(&self, path: &str) -> String {
        in_namespace(self.namespace.as_deref(), path)
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

    /// A client builder that sends the token on every request and trusts the CA file's
    /// certificates (besides the system's).
    pub fn http_builder(&self) -> Result<reqwest::ClientBuilder, ConnectError> {
        let mut builder = crate::client::http_client_builder().default_headers(self.headers()?);
        if let Some(path) = self.ca_file.as_ref().filter(|p| !p.as_os_str().is_empty()) {
            builder = builder.tls_certs_merge(read_ca_file(path)?);
        }
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_prefixes_its_routes_but_not_the_shared_ones() {
        assert_eq!(
            in_namespace(Some("acme"), "/v1/tasks?x=1"),
            "/v1/namespaces/acme/tasks?x=1"
        );
        assert_eq!(in_namespace(Some("default"), "/v1/tasks"), "/v1/tasks");
        assert_eq!(in_namespace(None, "/v1/tasks"), "/v1/tasks");
        assert_eq!(in_namespace(Some("acme"), "/v1/tokens"), "/v1/tokens");
        assert_eq!(
            in_namespace(Some("acme"), "/v1/namespaces"),
            "/v1/namespaces"
        );
        assert_eq!(in_namespace(Some("acme"), "/healthz"), "/healthz");
    }
}
