//! Subscriber tokens: HS256 JWTs signed with `auth.subscribe_secret`.
//!
//! A token lets its holder open streams of the id in its `sub` claim, or of
//! every id in its `ids` claim, from its `nbf` (if any) until its `exp`
//! (seconds since the epoch), both read exactly by this server's clock. With
//! `auth.subscribe_audience` / `auth.subscribe_issuer` set, its `aud` /
//! `iss` must match (`iss` as one string, not the list the JWT library
//! would take); unset, they are not looked at (an identity provider's
//! tokens carry both). The check runs before any stream state exists; a
//! stream that passes it ends when its token expires. Refusals say why in
//! our own words, never the JWT library's, naming the actual problem (an
//! algorithm other than HS256, a missing `exp`, ...).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// What a subscriber token says (other claims are allowed and not read).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Claims {
    /// The one stream id the token is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// Or every id it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Not valid before, seconds since the Unix epoch (RFC 7519 §4.1.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
}

/// What [`Verifier::check`] reads of a token: its claims, and its `iss`
/// as it was written.
#[derive(Deserialize)]
struct Presented {
    #[serde(flatten)]
    claims: Claims,
    /// The JWT library also takes a list of issuers that includes the one
    /// expected; this server takes one string.
    #[serde(default)]
    iss: Option<serde_json::Value>,
}

/// Checks tokens against one secret. Built once per server.
pub(crate) struct Verifier {
    key: DecodingKey,
    validation: Validation,
    /// `auth.subscribe_issuer` is set: `iss` must be that one string.
    issuer: bool,
}

impl Verifier {
    /// A verifier for `secret`; `audience` and `issuer`, when not empty,
    /// are what `aud` and `iss` must say.
    pub(crate) fn new(secret: &str, audience: &str, issuer: &str) -> Result<Self, String> {
        let mut validation = Validation::new(Algorithm::HS256);
        // The expiry is exact: a stream ends the second its token does; and
        // so is `nbf`, with the same (no) leeway.
        validation.leeway = 0;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        if !issuer.is_empty() {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        let key = DecodingKey::from_secret(secret.as_bytes()).map_err(|e| e.to_string())?;
        Ok(Verifier {
            key,
            validation,
            issuer: !issuer.is_empty(),
        })
    }

    /// The time left on `token` if it is valid for `id`; else why not.
    pub(crate) fn check(&self, token: &str, id: &str) -> Result<Duration, String> {
        let data = jsonwebtoken::decode::<Presented>(token, &self.key, &self.validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => "token expired".to_owned(),
                ErrorKind::ImmatureSignature => "token not valid yet (its nbf is in the future)".to_owned(),
                ErrorKind::InvalidSignature => "token signature does not match".to_owned(),
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => unreadable(token),
                ErrorKind::InvalidAudience => "token is not for this audience (aud)".to_owned(),
                ErrorKind::InvalidIssuer => "token is not from the expected issuer (iss)".to_owned(),
                // The library says "missing" of a claim it could not read.
                ErrorKind::MissingRequiredClaim(c) if !has_claim(token, c) => {
                    format!("token has no {c} claim")
                }
                ErrorKind::MissingRequiredClaim(c) | ErrorKind::InvalidClaimFormat(c) if c == "iss" => {
                    ISS_NOT_A_STRING.to_owned()
                }
                ErrorKind::MissingRequiredClaim(c) | ErrorKind::InvalidClaimFormat(c) => {
                    format!("token {c} claim is not of the expected form")
                }
                ErrorKind::Json(_) | ErrorKind::Utf8(_) => unreadable(token),
                _ => NOT_A_JWT.to_owned(),
            }
        })?;
        if self.issuer && !matches!(data.claims.iss, Some(serde_json::Value::String(_))) {
            return Err(ISS_NOT_A_STRING.to_owned());
        }
        let claims = data.claims.claims;
        let listed = claims.sub.as_deref() == Some(id)
            || claims.ids.as_ref().is_some_and(|ids| ids.iter().any(|i| i == id));
        if !listed {
            return Err(format!(
                "token is not for id {id:?} (neither its sub nor its ids)"
            ));
        }
        let left = Duration::from_secs(claims.exp).saturating_sub(since_epoch());
        if left.is_zero() {
            return Err("token expired".to_owned());
        }
        Ok(left)
    }
}

/// The refusal of a token that is not three base64url parts.
const NOT_A_JWT: &str = "token is not a valid JWT (three base64url parts: header.claims.signature)";

/// The refusal of an `iss` that is not one string (a list, a number).
const ISS_NOT_A_STRING: &str = "token iss is not a string (auth.subscribe_issuer names one issuer)";

/// Why a token whose header or claims the JWT library could not read (or
/// whose algorithm it refused) is refused: the algorithm its header names
/// when that is not HS256 (`none` among them; the library cannot even
/// name it), a missing `exp`, else claims not of the expected form. The
/// parts are read again only to say why; nothing in them is trusted.
fn unreadable(token: &str) -> String {
    use jsonwebtoken::dangerous::insecure_decode_claims;
    use serde_json::Value;
    // The library reads the middle of three parts as claims: the header is
    // given there.
    let header = token.split('.').next().unwrap_or_default();
    let alg = insecure_decode_claims::<Value>(format!(".{header}."))
        .ok()
        .and_then(|h| h.get("alg")?.as_str().map(str::to_owned));
    match alg {
        Some(alg) if alg != "HS256" => {
            if alg.len() <= 16 && alg.bytes().all(|b| b.is_ascii_alphanumeric()) {
                format!("token alg {alg} is not accepted (HS256 only)")
            } else {
                "token alg is not accepted (HS256 only)".to_owned()
            }
        }
        _ if jsonwebtoken::decode_header(token).is_err() => NOT_A_JWT.to_owned(),
        _ => claims_form(token),
    }
}

/// Whether `token`'s claims name `claim` at all (read only to say why it
/// is refused).
fn has_claim(token: &str, claim: &str) -> bool {
    jsonwebtoken::dangerous::insecure_decode_claims::<serde_json::Value>(token)
        .is_ok_and(|c| c.get(claim).is_some())
}

/// Why claims that are there could not be read.
fn claims_form(token: &str) -> String {
    let claims = jsonwebtoken::dangerous::insecure_decode_claims::<serde_json::Value>(token);
    if claims.is_ok_and(|c| c.is_object() && c.get("exp").is_none()) {
        return "token has no exp claim".to_owned();
    }
    "token claims are not of the expected form (sub: a string, ids: a list of strings, \
     exp and nbf: whole seconds)"
        .to_owned()
}

fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// A token for `ids` (one id goes in `sub`, several in `ids`) valid for
/// `ttl` from now, signed with `secret`.
pub fn mint(secret: &str, ids: &[String], ttl: Duration) -> anyhow::Result<String> {
    anyhow::ensure!(
        !secret.is_empty(),
        "auth.subscribe_secret is empty: set it to mint tokens"
    );
    anyhow::ensure!(!ids.is_empty(), "a token needs at least one id");
    let exp = (since_epoch() + ttl).as_secs();
    let claims = match ids {
        [one] => Claims {
            sub: Some(one.clone()),
            exp,
            ..Claims::default()
        },
        many => Claims {
            ids: Some(many.to_vec()),
            exp,
            ..Claims::default()
        },
    };
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes())?,
    )?)
}

/// The credentials of `Bearer <token>`, the scheme in any case.
pub(crate) fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let start = rest.iter().position(|b| *b != b' ')?;
    Some(&rest[start..])
}

/// Compares without an early exit, so timing does not leak a secret (the
/// publish token).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .fold(0u8, |acc, (byte_a, byte_b)| acc | (byte_a ^ byte_b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_ids_and_expire() {
        let v = Verifier::new("s3cret", "", "").unwrap();
        let one = mint("s3cret", &["foo".into()], Duration::from_secs(60)).unwrap();
        assert!(v.check(&one, "foo").unwrap() <= Duration::from_secs(60));
        assert!(v.check(&one, "bar").unwrap_err().contains("not for id"));
        let two = mint("s3cret", &["a".into(), "b".into()], Duration::from_secs(60)).unwrap();
        assert!(v.check(&two, "b").is_ok());
        assert!(v.check(&two, "c").is_err());
        let other = mint("other", &["foo".into()], Duration::from_secs(60)).unwrap();
        assert!(v.check(&other, "foo").unwrap_err().contains("signature"));
        let old = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Claims {
                sub: Some("foo".into()),
                exp: since_epoch().as_secs() - 1,
                ..Claims::default()
            },
            &EncodingKey::from_secret(b"s3cret").unwrap(),
        )
        .unwrap();
        assert_eq!(v.check(&old, "foo").unwrap_err(), "token expired");
        assert!(
            v.check("not.a.jwt", "foo")
                .unwrap_err()
                .contains("not a valid JWT")
        );
    }

    /// A token signed with `s3cret` carrying these claims.
    fn signed(claims: serde_json::Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"s3cret").unwrap(),
        )
        .unwrap()
    }

    /// Tokens as an identity provider mints them: `aud`, `iss`, `iat`,
    /// `nbf`, `jti` and claims of its own.
    #[test]
    fn identity_provider_tokens() {
        let now = since_epoch().as_secs();
        let idp = |aud: &str, nbf: u64| {
            signed(serde_json::json!({
                "iss": "https://id.example/", "aud": aud, "sub": "user-17", "ids": ["foo"],
                "iat": now, "nbf": nbf, "exp": now + 600, "jti": "x1", "email": "a@b.example"
            }))
        };
        let open = Verifier::new("s3cret", "", "").unwrap();
        assert!(open.check(&idp("some-client", now), "foo").is_ok());
        let strict = Verifier::new("s3cret", "switchboard", "https://id.example/").unwrap();
        assert!(strict.check(&idp("switchboard", now), "foo").is_ok());
        assert_eq!(
            strict.check(&idp("other", now), "foo").unwrap_err(),
            "token is not for this audience (aud)"
        );
        let other_issuer = Verifier::new("s3cret", "", "https://elsewhere/").unwrap();
        assert_eq!(
            other_issuer.check(&idp("x", now), "foo").unwrap_err(),
            "token is not from the expected issuer (iss)"
        );
        let no_aud =
            signed(serde_json::json!({ "iss": "https://id.example/", "sub": "foo", "exp": now + 60 }));
        assert_eq!(
            strict.check(&no_aud, "foo").unwrap_err(),
            "token has no aud claim"
        );
        // Not before: refused until then.
        assert_eq!(
            open.check(&idp("x", now + 3600), "foo").unwrap_err(),
            "token not valid yet (its nbf is in the future)"
        );
        // Claims of the wrong form are refused in our words, not serde's.
        let odd = signed(serde_json::json!({ "sub": 7, "exp": now + 60 }));
        let why = open.check(&odd, "foo").unwrap_err();
        assert!(
            why.starts_with("token claims are not of the expected form"),
            "{why}"
        );
        assert!(!why.contains("invalid type"), "{why}");
    }

    /// A token of `header` and `claims` as given, signed HS256 with
    /// `s3cret` whatever its header says.
    fn forged(header: serde_json::Value, claims: serde_json::Value) -> String {
        use base64::Engine as _;
        let part = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
        };
        let message = format!("{}.{}", part(&header), part(&claims));
        let key = EncodingKey::from_secret(b"s3cret").unwrap();
        let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).unwrap();
        format!("{message}.{signature}")
    }

    /// Refusals name what is wrong: an algorithm other than HS256 (`none`
    /// included), a missing `exp`, an `iss` that is not one string when an
    /// issuer is expected (a list is not looked at when none is).
    #[test]
    fn refusals_name_the_problem() {
        let now = since_epoch().as_secs();
        let v = Verifier::new("s3cret", "", "").unwrap();
        let claims = serde_json::json!({ "sub": "foo", "exp": now + 60 });
        let none = forged(serde_json::json!({ "alg": "none" }), claims.clone());
        let unsigned = format!("{}.", none.rsplit_once('.').unwrap().0);
        for token in [&none, &unsigned] {
            assert_eq!(
                v.check(token, "foo").unwrap_err(),
                "token alg none is not accepted (HS256 only)"
            );
        }
        let hs384 = forged(serde_json::json!({ "alg": "HS384" }), claims.clone());
        assert_eq!(
            v.check(&hs384, "foo").unwrap_err(),
            "token alg HS384 is not accepted (HS256 only)"
        );
        let odd = forged(serde_json::json!({ "alg": "x\n\"y" }), claims);
        assert_eq!(
            v.check(&odd, "foo").unwrap_err(),
            "token alg is not accepted (HS256 only)"
        );
        let no_exp = signed(serde_json::json!({ "sub": "foo" }));
        assert_eq!(v.check(&no_exp, "foo").unwrap_err(), "token has no exp claim");
        let iss = "https://id.example/";
        let listed = signed(serde_json::json!({ "sub": "foo", "exp": now + 60, "iss": [iss] }));
        let strict = Verifier::new("s3cret", "", iss).unwrap();
        assert_eq!(
            v.check(&listed, "foo").map(|_| ()),
            Ok(()),
            "no issuer set: not looked at"
        );
        assert!(
            strict
                .check(&listed, "foo")
                .unwrap_err()
                .starts_with("token iss is not a string")
        );
        let number = signed(serde_json::json!({ "sub": "foo", "exp": now + 60, "iss": 7 }));
        assert!(
            strict
                .check(&number, "foo")
                .unwrap_err()
                .starts_with("token iss is not a string")
        );
        let one = signed(serde_json::json!({ "sub": "foo", "exp": now + 60, "iss": iss }));
        assert!(strict.check(&one, "foo").is_ok());
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_credentials(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"BEARER   abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"Bearerabc"), None);
        assert_eq!(bearer_credentials(b"Basic abc"), None);
        assert_eq!(bearer_credentials(b"Bearer "), None);
        assert_eq!(bearer_credentials(b"Bear"), None);
    }

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
