//! Bearer-token checks in front of the remote API's routes. A request
//! without a token, or with one the tokens file does not hold, gets a 401
//! and reaches no handler. The `Authorization` header is never logged;
//! the token's name is, so an operator can tell who did what.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::listener::Peer;
use super::tokens::{TokenError, TokenSet};
use crate::api::types::{ErrorBody, ErrorDetail};

/// The tokens in force and the file they came from.
pub struct TokenStore {
    path: PathBuf,
    set: RwLock<Arc<TokenSet>>,
}

impl TokenStore {
    pub fn load(path: PathBuf) -> Result<TokenStore, TokenError> {
        let set = TokenSet::load(&path)?;
        Ok(TokenStore {
            path,
            set: RwLock::new(Arc::new(set)),
        })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn current(&self) -> Arc<TokenSet> {
        match self.set.read() {
            Ok(set) => Arc::clone(&set),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Reads the file again; on an error the tokens in force stay.
    pub fn reload(&self) -> Result<usize, TokenError> {
        let set = Arc::new(TokenSet::load(&self.path)?);
        let count = set.names().count();
        match self.set.write() {
            Ok(mut held) => *held = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
        Ok(count)
    }
}

fn unauthorized(message: &str) -> Response {
    let body = ErrorBody {
        error: ErrorDetail {
            code: "unauthorized".into(),
            message: message.into(),
            resource: None,
            field: None,
        },
    };
    let mut response = (StatusCode::UNAUTHORIZED, Json(body)).into_response();
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The token of `Authorization: Bearer TOKEN`, if the header has that form.
fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

pub async fn require_token(
    State(tokens): State<Arc<TokenStore>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let Some(presented) = bearer(&request) else {
        tracing::warn!(%peer, %method, %path, "remote API request without a bearer token refused");
        return unauthorized(
            "this API needs `Authorization: Bearer TOKEN`; an operator makes one with `sandboxd token create NAME`",
        );
    };
    let set = tokens.current();
    let Some(name) = set.verify(presented).map(str::to_string) else {
        tracing::warn!(%peer, %method, %path, "remote API request with an unknown token refused");
        return unauthorized(
            "the bearer token is not one this daemon accepts (revoked, or from another daemon)",
        );
    };
    let response = next.run(request).await;
    tracing::info!(%peer, token = %name, %method, %path, status = response.status().as_u16(), "remote API request");
    response
}
