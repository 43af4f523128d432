//! `idem openapi`: prints the API's OpenAPI 3.1 document, the one
//! `GET /openapi.json` serves.

pub(crate) fn run() -> anyhow::Result<()> {
    print!("{}", crate::http::openapi_json());
    Ok(())
}
