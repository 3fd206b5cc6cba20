//! Subscriber tokens: HS256 JWTs signed with `auth.subscribe_secret`.
//!
//! A token lets its holder open streams of the id in its `sub` claim, or of
//! every id in its `ids` claim, until its `exp` (seconds since the epoch).
//! The check runs before any stream state exists; a stream that passes it
//! ends when its token expires.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// What a subscriber token says.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    /// The one stream id the token is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// Or every id it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
}

/// Checks tokens against one secret. Built once per server.
pub(crate) struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl Verifier {
    /// A verifier for `secret`.
    pub(crate) fn new(secret: &str) -> Result<Self, String> {
        let mut validation = Validation::new(Algorithm::HS256);
        // The expiry is exact: a stream ends the second its token does.
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp"]);
        let key = DecodingKey::from_secret(secret.as_bytes()).map_err(|e| e.to_string())?;
        Ok(Verifier { key, validation })
    }

    /// The time left on `token` if it is valid for `id`; else why not.
    pub(crate) fn check(&self, token: &str, id: &str) -> Result<Duration, String> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => "token expired".to_owned(),
                ErrorKind::InvalidSignature => "token signature does not match".to_owned(),
                ErrorKind::InvalidAlgorithm => "token is not HS256".to_owned(),
                ErrorKind::MissingRequiredClaim(c) => format!("token has no {c} claim"),
                _ => format!("token is not a valid JWT ({e})"),
            }
        })?;
        let claims = data.claims;
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
            ids: None,
            exp,
        },
        many => Claims {
            sub: None,
            ids: Some(many.to_vec()),
            exp,
        },
    };
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes())?,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_ids_and_expire() {
        let v = Verifier::new("s3cret").unwrap();
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
                ids: None,
                exp: since_epoch().as_secs() - 1,
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
}
