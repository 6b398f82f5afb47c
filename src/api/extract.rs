//! Path and query extractors whose refusals are the API's own 400 error
//! (JSON, with a code), not axum's plain-text rejection. Handlers use them
//! under axum's names.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Path parameters; a segment that does not parse (`-1` as a process id)
/// is a 400 `invalid_path_parameter`.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::bad(
                "invalid_path_parameter",
                rejection.body_text(),
            )),
        }
    }
}

/// The query string; one that does not parse (an unknown or malformed
/// parameter) is a 400 `invalid_query`.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(ApiError::bad("invalid_query", rejection.body_text())),
        }
    }
}
