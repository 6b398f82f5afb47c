//! The short pages the ingress answers with itself (401, 404, 502, ...).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Response, StatusCode};

use super::body::IngressBody;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A small HTML page saying what happened and what to do.
pub fn page(status: StatusCode, detail: &str) -> Response<IngressBody> {
    let title = status.canonical_reason().unwrap_or("Error");
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{code} {title}</title></head>\
         <body><h1>{code} {title}</h1><p>{detail}</p><p><small>sandboxd ingress</small></p></body></html>\n",
        code = status.as_u16(),
        detail = escape(detail),
    );
    let mut response = Response::new(
        Full::new(Bytes::from(html))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    response
}

/// A redirect to `location` (same origin), with `cookie` set if given.
pub fn redirect(location: &str, cookie: Option<&str>) -> Response<IngressBody> {
    let mut response = page(StatusCode::FOUND, &format!("Moved to {location}"));
    if let Ok(value) = hyper::header::HeaderValue::from_str(location) {
        response
            .headers_mut()
            .insert(hyper::header::LOCATION, value);
    }
    if let Some(cookie) = cookie.and_then(|c| hyper::header::HeaderValue::from_str(c).ok()) {
        response
            .headers_mut()
            .insert(hyper::header::SET_COOKIE, cookie);
    }
    response
}
