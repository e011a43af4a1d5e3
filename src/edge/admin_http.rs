//! What every answer of the admin listener shares: the admin token as a request presents it
//! (`Authorization: Bearer <token>`, one header, compared in constant time), checked by the
//! admin APIs and the dashboard, and a response with a body and its length.

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub fn bearer_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let bytes = value.as_bytes();
    let Some(presented) = bytes
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| &bytes[7..])
    else {
        return false;
    };
    subtle::ConstantTimeEq::ct_eq(presented, token.as_bytes()).into()
}

/// A response of `status` with `body` of `content_type`, and its length.
pub fn response(status: u16, content_type: &'static str, body: String) -> http::Response<Vec<u8>> {
    let body = body.into_bytes();
    let length = body.len();
    let mut response = http::Response::new(body);
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    let headers = response.headers_mut();
    let content_type = http::HeaderValue::from_static(content_type);
    headers.insert(http::header::CONTENT_TYPE, content_type);
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(length),
    );
    response
}
