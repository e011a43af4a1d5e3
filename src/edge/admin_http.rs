//! What every answer of the admin listener shares: the admin token as a request presents it
//! (`Authorization: Bearer <token>`, one header, compared in constant time), checked by the
//! admin APIs and the dashboard, a response with a body and its length, and a refusal as an
//! `application/problem+json` body, in the shape of the proxy's own (`edge/proxy/respond.rs`).

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

/// A refusal of `status` as `application/problem+json` (RFC 9457): `type` `about:blank`, the
/// status's reason as `title`, `status` and `detail`, in the order the proxy writes them.
pub fn problem(status: u16, detail: &str) -> http::Response<Vec<u8>> {
    let code =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let string = |text: &str| serde_json::Value::from(text).to_string();
    let body = format!(
        "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{}}}\n",
        string(code.canonical_reason().unwrap_or("Error")),
        code.as_u16(),
        string(detail),
    );
    response(code.as_u16(), "application/problem+json", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_json_in_the_proxys_shape() {
        let answer = problem(400, "unknown parameter \"x\"");
        assert_eq!(answer.status(), 400);
        assert_eq!(
            answer.headers()[http::header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(
            String::from_utf8_lossy(answer.body()),
            "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\"detail\":\"unknown parameter \\\"x\\\"\"}\n"
        );
    }
}
