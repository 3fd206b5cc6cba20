//! Subscriber tokens: JWTs signed with `auth.subscribe_secret` (HS256), or
//! with the private half of `auth.subscribe_public_key_file` (an identity
//! provider's RSA, EC or Ed25519 key: RS256/384/512, PS256/384/512,
//! ES256/384, EdDSA). Either or both may be set. The key decides the
//! algorithm: a token is checked only with the key its `alg` fits, so no
//! `none`, and no HS256 "signed" with the public key as its secret.
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
//! algorithm no configured key takes, a missing `exp`, ...).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, EncodingKey, Header, Validation};
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

/// A key tokens may be signed with, and the claims rule with the
/// algorithms that fit it.
struct Key {
    key: DecodingKey,
    validation: Validation,
}

/// Checks tokens against the configured keys. Built once per server.
pub(crate) struct Verifier {
    keys: Vec<Key>,
    /// The identity provider's keys from `auth.jwks_url`, as last fetched
    /// (filled by [`crate::jwks`]).
    jwks: Option<Arc<JwksKeys>>,
    /// Every algorithm some key takes, as a token's `alg` names it.
    accepted: Vec<String>,
    /// `auth.subscribe_issuer` is set: `iss` must be that one string.
    issuer: bool,
}

/// What [`Verifier::verify`] says of a token.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Valid for the id, for this long yet.
    Valid(Duration),
    /// Refused, and why.
    Refused(String),
    /// Its `kid` names no key fetched from `auth.jwks_url` (yet): known
    /// only once the keys are fetched again.
    UnknownKid(String),
}

/// The keys fetched from `auth.jwks_url`, replaced whole at each fetch
/// that brings any usable key; read by every check that names a `kid`.
pub(crate) struct JwksKeys {
    /// The claims rule every key checks with.
    rule: Validation,
    set: RwLock<Arc<KeySet>>,
}

/// One fetch's keys.
#[derive(Default)]
struct KeySet {
    /// By `kid`.
    named: HashMap<String, Key>,
    /// Keys without a `kid`: tried in turn for a token without one.
    unnamed: Vec<Key>,
}

/// The algorithms no JWKS key ever takes: a key an identity provider
/// publishes is public, so a symmetric one would let anyone sign.
const JWKS_ALGORITHMS: [Algorithm; 9] = {
    use Algorithm::*;
    [RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA]
};

impl JwksKeys {
    /// No keys yet; `rule` as [`Verifier::new`] makes it.
    fn new(rule: Validation) -> JwksKeys {
        JwksKeys {
            rule,
            set: RwLock::new(Arc::default()),
        }
    }

    /// How many keys are held.
    pub(crate) fn len(&self) -> usize {
        let set = self.current();
        set.named.len() + set.unnamed.len()
    }

    /// Whether a key of `kid` is held.
    pub(crate) fn knows(&self, kid: &str) -> bool {
        self.current().named.contains_key(kid)
    }

    fn current(&self) -> Arc<KeySet> {
        Arc::clone(&self.set.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Takes the keys of a JWKS document (RFC 7517 `{"keys": [...]}`) in
    /// place of those held, and says how many it took and why it skipped
    /// any. Only signing keys of the kinds [`public_key`] takes are used:
    /// a symmetric (`oct`) key, an encryption key (`"use": "enc"`), an
    /// algorithm other than [`JWKS_ALGORITHMS`], another curve, are
    /// skipped. A document with no usable key changes nothing and is an
    /// error (the keys held keep working).
    pub(crate) fn install(&self, document: &[u8]) -> Result<(usize, Vec<String>), String> {
        #[derive(Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let doc: Document = serde_json::from_slice(document)
            .map_err(|e| format!("not a JWKS document ({{\"keys\": [...]}}): {e}"))?;
        let mut set = KeySet::default();
        let mut skipped = Vec::new();
        for (i, value) in doc.keys.into_iter().enumerate() {
            let kid = value.get("kid").and_then(|k| k.as_str()).map(str::to_owned);
            let name = kid
                .as_deref()
                .map_or_else(|| format!("key {i}"), |k| format!("key {k:?}"));
            match self.key_of(value) {
                Ok(key) => match kid {
                    Some(kid) => {
                        set.named.insert(kid, key);
                    }
                    None => set.unnamed.push(key),
                },
                Err(why) => skipped.push(format!("{name}: {why}")),
            }
        }
        let taken = set.named.len() + set.unnamed.len();
        if taken == 0 {
            return Err(match skipped.as_slice() {
                [] => "the JWKS holds no key".to_owned(),
                why => format!("the JWKS holds no usable key ({})", why.join("; ")),
            });
        }
        *self
            .set
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(set);
        Ok((taken, skipped))
    }

    /// A JWK as a key, with the algorithms it verifies: those its `alg`
    /// names (one), or those its kind and curve fit.
    fn key_of(&self, value: serde_json::Value) -> Result<Key, String> {
        use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
        let jwk: Jwk =
            serde_json::from_value(value).map_err(|e| format!("not a JWK this server reads ({e})"))?;
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            return Err("an encryption key (\"use\": \"enc\")".to_owned());
        }
        let fits: Vec<Algorithm> = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => algorithms(AlgorithmFamily::Rsa),
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => vec![Algorithm::ES256],
                EllipticCurve::P384 => vec![Algorithm::ES384],
                _ => return Err("an EC key on a curve other than P-256 or P-384".to_owned()),
            },
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                vec![Algorithm::EdDSA]
            }
            AlgorithmParameters::OctetKey(_) => {
                return Err("a symmetric (oct) key: a published secret would let anyone sign".to_owned());
            }
            _ => return Err("not an RSA, EC or Ed25519 key".to_owned()),
        };
        let algorithms = match jwk.common.key_algorithm {
            None => fits,
            Some(named) => {
                let named = Algorithm::from_str(&format!("{named:?}"))
                    .ok()
                    .filter(|a| JWKS_ALGORITHMS.contains(a) && fits.contains(a));
                match named {
                    Some(alg) => vec![alg],
                    None => return Err(format!("its alg {named:?} does not fit its kind of key")),
                }
            }
        };
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("unreadable ({e})"))?;
        if !usable(&key, algorithms[0]) {
            return Err("a key the token library cannot use".to_owned());
        }
        let mut validation = self.rule.clone();
        validation.algorithms = algorithms;
        Ok(Key { key, validation })
    }
}

/// The algorithms a key of `family` verifies. A shared secret takes HS256
/// only, as it always did.
fn algorithms(family: AlgorithmFamily) -> Vec<Algorithm> {
    use Algorithm::*;
    match family {
        AlgorithmFamily::Hmac => vec![HS256],
        AlgorithmFamily::Rsa => vec![RS256, RS384, RS512, PS256, PS384, PS512],
        AlgorithmFamily::Ec => vec![ES256, ES384],
        AlgorithmFamily::Ed => vec![EdDSA],
    }
}

/// An identity provider's public key, and the algorithms it verifies.
pub(crate) struct PublicKey {
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// A public key in PEM (`BEGIN PUBLIC KEY`, or `BEGIN RSA PUBLIC KEY`):
/// RSA, EC P-256 (ES256 only), EC P-384 (ES384 only) or Ed25519. The key
/// is tried now, so that one the library cannot use (another curve, an RSA
/// key of an unsupported size) stops the start instead of failing every
/// token later.
pub(crate) fn public_key(pem: &[u8]) -> Result<PublicKey, String> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("PRIVATE KEY-----") {
        return Err(
            "the file holds a private key: give the public key (openssl pkey -in KEY -pubout)".into(),
        );
    }
    if !text.contains("-----BEGIN PUBLIC KEY-----") && !text.contains("-----BEGIN RSA PUBLIC KEY-----") {
        return Err("not a PEM public key (-----BEGIN PUBLIC KEY-----)".into());
    }
    let key = DecodingKey::from_rsa_pem(pem)
        .or_else(|_| DecodingKey::from_ec_pem(pem))
        .or_else(|_| DecodingKey::from_ed_pem(pem))
        .map_err(|_| "not an RSA, EC (P-256, P-384) or Ed25519 public key".to_owned())?;
    let family = key.family();
    // An EC key verifies the one algorithm of its curve: each is tried.
    let algorithms: Vec<Algorithm> = match family {
        AlgorithmFamily::Ec => [Algorithm::ES256, Algorithm::ES384]
            .into_iter()
            .filter(|&alg| usable(&key, alg))
            .collect(),
        _ if usable(&key, algorithms(family)[0]) => algorithms(family),
        _ => Vec::new(),
    };
    if algorithms.is_empty() {
        return Err(match family {
            AlgorithmFamily::Ec => "an EC key on a curve other than P-256 or P-384".to_owned(),
            _ => "a key the token library cannot use (an RSA key of an unsupported size?)".to_owned(),
        });
    }
    Ok(PublicKey { key, algorithms })
}

/// Whether `key` can check a token in `alg`: a probe whose signature
/// cannot match is refused for its signature when the key is usable, and
/// for the key when it is not.
fn usable(key: &DecodingKey, alg: Algorithm) -> bool {
    use jsonwebtoken::errors::ErrorKind;
    // `{"alg":"..."}`, base64url.
    let header = match alg {
        Algorithm::RS256 => "eyJhbGciOiJSUzI1NiJ9",
        Algorithm::ES256 => "eyJhbGciOiJFUzI1NiJ9",
        Algorithm::ES384 => "eyJhbGciOiJFUzM4NCJ9",
        Algorithm::EdDSA => "eyJhbGciOiJFZERTQSJ9",
        _ => return true,
    };
    let mut validation = Validation::new(alg);
    validation.validate_exp = false;
    validation.set_required_spec_claims::<&str>(&[]);
    let probe = format!("{header}.e30.AAAA");
    match jsonwebtoken::decode::<serde_json::Value>(probe, key, &validation) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            ErrorKind::InvalidEcdsaKey
                | ErrorKind::InvalidEddsaKey
                | ErrorKind::InvalidRsaKey(_)
                | ErrorKind::InvalidKeyFormat
        ),
    }
}

impl Verifier {
    /// A verifier for `secret` (HS256; empty: none) and `public_key`
    /// (see [`public_key`]); `audience` and `issuer`, when not empty, are
    /// what `aud` and `iss` must say. At least one key is needed.
    pub(crate) fn new(
        secret: &str,
        public_key: Option<PublicKey>,
        jwks: bool,
        audience: &str,
        issuer: &str,
    ) -> Result<Self, String> {
        let mut keys = Vec::new();
        if !secret.is_empty() {
            let key = DecodingKey::from_secret(secret.as_bytes()).map_err(|e| e.to_string())?;
            keys.push((key, algorithms(AlgorithmFamily::Hmac)));
        }
        keys.extend(public_key.map(|p| (p.key, p.algorithms)));
        if keys.is_empty() && !jwks {
            return Err("no key to check tokens with".into());
        }
        let rule = claims_rule(audience, issuer);
        let keys: Vec<Key> = keys
            .into_iter()
            .map(|(key, algorithms)| {
                let mut validation = rule.clone();
                validation.algorithms = algorithms;
                Key { key, validation }
            })
            .collect();
        let mut accepted: Vec<Algorithm> = keys
            .iter()
            .flat_map(|k| k.validation.algorithms.iter().copied())
            .collect();
        let jwks = jwks.then(|| Arc::new(JwksKeys::new(rule)));
        if jwks.is_some() {
            accepted.extend(
                JWKS_ALGORITHMS
                    .iter()
                    .filter(|a| !accepted.contains(a))
                    .collect::<Vec<_>>(),
            );
        }
        Ok(Verifier {
            keys,
            jwks,
            accepted: accepted.iter().map(|a| format!("{a:?}")).collect(),
            issuer: !issuer.is_empty(),
        })
    }

    /// The keys `auth.jwks_url` gives, when it is set.
    pub(crate) fn jwks(&self) -> Option<&Arc<JwksKeys>> {
        self.jwks.as_ref()
    }

    /// The time left on `token` if it is valid for `id`; else why not (a
    /// `kid` not among the JWKS keys held is refused: see
    /// [`Verifier::verify`] for the verdict that asks for a fetch).
    pub(crate) fn check(&self, token: &str, id: &str) -> Result<Duration, String> {
        match self.verify(token, id) {
            Verdict::Valid(left) => Ok(left),
            Verdict::Refused(why) => Err(why),
            Verdict::UnknownKid(kid) => Err(kid_not_listed(&kid)),
        }
    }

    /// What `token` is for `id`. The key is chosen by the token's header:
    /// its `kid` among the JWKS keys, else the configured key its `alg`
    /// fits, else (no `kid`) a JWKS key without a `kid` its `alg` fits. A
    /// key checks only the algorithms it fits, so no `none`, and no HS256
    /// "signed" with a public key. A `kid` no key has, on a token a
    /// configured key does not verify, is [`Verdict::UnknownKid`].
    pub(crate) fn verify(&self, token: &str, id: &str) -> Verdict {
        let header = match jsonwebtoken::decode_header(token) {
            Ok(header) => header,
            Err(_) => return Verdict::Refused(unreadable(token, &self.accepted)),
        };
        let alg = header.alg;
        let fits = |k: &&Key| k.validation.algorithms.contains(&alg);
        let verdict = |checked: Result<Duration, String>| match checked {
            Ok(left) => Verdict::Valid(left),
            Err(why) => Verdict::Refused(why),
        };
        let jwks = self.jwks.as_ref().map(|j| j.current());
        let asymmetric = JWKS_ALGORITHMS.contains(&alg);
        // A `kid` names a JWKS key only for the algorithms such keys take:
        // an HS256 token is the secret's, whatever its `kid`.
        if let (Some(set), Some(kid), true) = (&jwks, &header.kid, asymmetric)
            && let Some(k) = set.named.get(kid)
        {
            if !fits(&k) {
                let fit: Vec<String> = k.validation.algorithms.iter().map(|a| format!("{a:?}")).collect();
                return Verdict::Refused(not_accepted(&format!("{alg:?}"), &fit));
            }
            return verdict(self.check_with(k, token, id));
        }
        let configured = self.keys.iter().find(fits);
        match (&jwks, &header.kid, configured) {
            // A configured key of its kind: checked with it, unless its
            // signature fails it and the JWKS may yet have its key.
            (_, kid, Some(k)) => match (self.check_with(k, token, id), &jwks) {
                (Err(why), Some(set)) if why == BAD_SIGNATURE && asymmetric => match kid {
                    Some(kid) => Verdict::UnknownKid(kid.clone()),
                    None => self
                        .try_unnamed(set, token, id, alg)
                        .unwrap_or(Verdict::Refused(why)),
                },
                (checked, _) => verdict(checked),
            },
            (Some(_), Some(kid), None) if asymmetric => Verdict::UnknownKid(kid.clone()),
            (Some(set), None, None) if asymmetric => {
                self.try_unnamed(set, token, id, alg).unwrap_or_else(|| {
                    Verdict::Refused(
                        "token has no kid, and auth.jwks_url has no key of its kind without one".to_owned(),
                    )
                })
            }
            _ => Verdict::Refused(not_accepted(&format!("{alg:?}"), &self.accepted)),
        }
    }

    /// `token` (without a `kid`) checked with the JWKS keys without one
    /// that fit `alg`, in turn, until one's signature matches; `None`
    /// when no such key is held.
    fn try_unnamed(&self, set: &KeySet, token: &str, id: &str, alg: Algorithm) -> Option<Verdict> {
        let mut last = None;
        for k in set
            .unnamed
            .iter()
            .filter(|k| k.validation.algorithms.contains(&alg))
        {
            match self.check_with(k, token, id) {
                Ok(left) => return Some(Verdict::Valid(left)),
                Err(why) if why == BAD_SIGNATURE => last = Some(Verdict::Refused(why)),
                Err(why) => return Some(Verdict::Refused(why)),
            }
        }
        last
    }

    fn check_with(&self, k: &Key, token: &str, id: &str) -> Result<Duration, String> {
        let data = jsonwebtoken::decode::<Presented>(token, &k.key, &k.validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => "token expired".to_owned(),
                ErrorKind::ImmatureSignature => "token not valid yet (its nbf is in the future)".to_owned(),
                ErrorKind::InvalidSignature => BAD_SIGNATURE.to_owned(),
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                    unreadable(token, &self.accepted)
                }
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
                ErrorKind::Json(_) | ErrorKind::Utf8(_) => unreadable(token, &self.accepted),
                // A signature of the wrong shape for its key (an ES384
                // token checked with a P-256 key) does not match either.
                ErrorKind::InvalidEcdsaKey
                | ErrorKind::InvalidEddsaKey
                | ErrorKind::InvalidRsaKey(_)
                | ErrorKind::InvalidKeyFormat => BAD_SIGNATURE.to_owned(),
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

/// The claims every token must pass, whatever its key.
fn claims_rule(audience: &str, issuer: &str) -> Validation {
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
    validation
}

/// The claims of a token whose signature was checked (or is checked
/// before they are used), as JSON.
pub(crate) fn claims_of(token: &str) -> Option<serde_json::Value> {
    jsonwebtoken::dangerous::insecure_decode_claims::<serde_json::Value>(token).ok()
}

/// The refusal of a signature its key does not verify.
const BAD_SIGNATURE: &str = "token signature does not match";

/// The refusal of a `kid` that names none of `auth.jwks_url`'s keys, after
/// they were fetched again (or lately enough).
pub(crate) fn kid_not_listed(kid: &str) -> String {
    if kid.len() <= 64
        && kid
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    {
        format!("token kid \"{kid}\" names none of auth.jwks_url's keys")
    } else {
        "token kid names none of auth.jwks_url's keys".to_owned()
    }
}

/// The refusal of a token that is not three base64url parts.
const NOT_A_JWT: &str = "token is not a valid JWT (three base64url parts: header.claims.signature)";

/// The refusal of an `iss` that is not one string (a list, a number).
const ISS_NOT_A_STRING: &str = "token iss is not a string (auth.subscribe_issuer names one issuer)";

/// The refusal of a token whose `alg` no configured key takes.
fn not_accepted(alg: &str, accepted: &[String]) -> String {
    let list = match accepted {
        [one] => format!("{one} only"),
        many => format!("accepted: {}", many.join(", ")),
    };
    if alg.len() <= 16 && alg.bytes().all(|b| b.is_ascii_alphanumeric()) {
        format!("token alg {alg} is not accepted ({list})")
    } else {
        format!("token alg is not accepted ({list})")
    }
}

/// Why a token whose header or claims the JWT library could not read (or
/// whose algorithm it refused) is refused: the algorithm its header names
/// when no key takes it (`none` among them; the library cannot even
/// name it), a missing `exp`, else claims not of the expected form. The
/// parts are read again only to say why; nothing in them is trusted.
fn unreadable(token: &str, accepted: &[String]) -> String {
    use jsonwebtoken::dangerous::insecure_decode_claims;
    use serde_json::Value;
    // The library reads the middle of three parts as claims: the header is
    // given there.
    let header = token.split('.').next().unwrap_or_default();
    let alg = insecure_decode_claims::<Value>(format!(".{header}."))
        .ok()
        .and_then(|h| h.get("alg")?.as_str().map(str::to_owned));
    match alg {
        Some(alg) if !accepted.contains(&alg) => not_accepted(&alg, accepted),
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
        "auth.subscribe_secret is empty: set it to mint tokens (tokens checked with \
         auth.subscribe_public_key_file are minted by the identity provider that holds its private key)"
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
        let v = Verifier::new("s3cret", None, false, "", "").unwrap();
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
        let open = Verifier::new("s3cret", None, false, "", "").unwrap();
        assert!(open.check(&idp("some-client", now), "foo").is_ok());
        let strict = Verifier::new("s3cret", None, false, "switchboard", "https://id.example/").unwrap();
        assert!(strict.check(&idp("switchboard", now), "foo").is_ok());
        assert_eq!(
            strict.check(&idp("other", now), "foo").unwrap_err(),
            "token is not for this audience (aud)"
        );
        let other_issuer = Verifier::new("s3cret", None, false, "", "https://elsewhere/").unwrap();
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
        let v = Verifier::new("s3cret", None, false, "", "").unwrap();
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
        let strict = Verifier::new("s3cret", None, false, "", iss).unwrap();
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

    /// A test key pair of `tests/fixtures/jwt`: (private PEM, public PEM).
    fn pair(name: &str) -> (Vec<u8>, Vec<u8>) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt/");
        let read = |f: String| std::fs::read(format!("{dir}{f}")).unwrap();
        (read(format!("{name}.key.pem")), read(format!("{name}.pub.pem")))
    }

    /// A token for `foo`, valid for a minute, signed in `alg` with `key`.
    fn signed_with(alg: Algorithm, key: &EncodingKey) -> String {
        let claims = Claims {
            sub: Some("foo".into()),
            exp: since_epoch().as_secs() + 60,
            ..Claims::default()
        };
        jsonwebtoken::encode(&Header::new(alg), &claims, key).unwrap()
    }

    /// A verifier of `public` alone (and `secret`, when not empty).
    fn verifier(secret: &str, public: &[u8]) -> Verifier {
        Verifier::new(secret, Some(public_key(public).unwrap()), false, "", "").unwrap()
    }

    #[test]
    fn identity_provider_keys_decide_their_algorithms() {
        use Algorithm::*;
        let (rsa, rsa_pub) = pair("rsa");
        let (p256, p256_pub) = pair("p256");
        let (p384, p384_pub) = pair("p384");
        let (ed, ed_pub) = pair("ed25519");
        let rsa_key = EncodingKey::from_rsa_pem(&rsa).unwrap();
        let v = verifier("", &rsa_pub);
        for alg in [RS256, RS384, RS512, PS256, PS384, PS512] {
            let t = signed_with(alg, &rsa_key);
            assert!(v.check(&t, "foo").is_ok(), "{alg:?}: {:?}", v.check(&t, "foo"));
            assert!(v.check(&t, "bar").unwrap_err().contains("not for id"));
        }
        let p256_key = EncodingKey::from_ec_pem(&p256).unwrap();
        let v256 = verifier("", &p256_pub);
        assert!(v256.check(&signed_with(ES256, &p256_key), "foo").is_ok());
        let p384_key = EncodingKey::from_ec_pem(&p384).unwrap();
        assert!(
            verifier("", &p384_pub)
                .check(&signed_with(ES384, &p384_key), "foo")
                .is_ok()
        );
        // A P-256 key verifies ES256 only, a P-384 key ES384 only.
        assert_eq!(
            v256.check(&signed_with(ES384, &p384_key), "foo").unwrap_err(),
            "token alg ES384 is not accepted (ES256 only)"
        );
        let ed_key = EncodingKey::from_ed_pem(&ed).unwrap();
        assert!(
            verifier("", &ed_pub)
                .check(&signed_with(EdDSA, &ed_key), "foo")
                .is_ok()
        );
        // A token in an algorithm of another kind of key is refused by name.
        assert_eq!(
            v.check(&signed_with(ES256, &p256_key), "foo").unwrap_err(),
            "token alg ES256 is not accepted (accepted: RS256, RS384, RS512, PS256, PS384, PS512)"
        );
        assert_eq!(
            v256.check(&signed_with(EdDSA, &ed_key), "foo").unwrap_err(),
            "token alg EdDSA is not accepted (ES256 only)"
        );
    }

    #[test]
    fn a_public_key_is_never_an_hmac_secret_and_none_is_never_an_algorithm() {
        let (_, rsa_pub) = pair("rsa");
        // The classic confusion: HS256 "signed" with the public key as the
        // secret. Without a secret it is refused by its alg; with one, its
        // signature is checked against the secret, not the key.
        let confused = signed_with(Algorithm::HS256, &EncodingKey::from_secret(&rsa_pub).unwrap());
        assert_eq!(
            verifier("", &rsa_pub).check(&confused, "foo").unwrap_err(),
            "token alg HS256 is not accepted (accepted: RS256, RS384, RS512, PS256, PS384, PS512)"
        );
        let both = verifier("s3cret", &rsa_pub);
        assert_eq!(
            both.check(&confused, "foo").unwrap_err(),
            "token signature does not match"
        );
        let claims = serde_json::json!({ "sub": "foo", "exp": since_epoch().as_secs() + 60 });
        let none = forged(serde_json::json!({ "alg": "none" }), claims);
        assert_eq!(
            both.check(&none, "foo").unwrap_err(),
            "token alg none is not accepted (accepted: HS256, RS256, RS384, RS512, PS256, PS384, PS512)"
        );
        // Both keys work side by side.
        let hs = mint("s3cret", &["foo".into()], Duration::from_secs(60)).unwrap();
        assert!(both.check(&hs, "foo").is_ok());
        let rs = signed_with(
            Algorithm::RS256,
            &EncodingKey::from_rsa_pem(&pair("rsa").0).unwrap(),
        );
        assert!(both.check(&rs, "foo").is_ok());
    }

    #[test]
    fn only_a_public_key_in_pem_is_taken() {
        let (private, _) = pair("rsa");
        assert!(public_key(&private).err().unwrap().contains("private key"));
        assert!(
            public_key(b"hello")
                .err()
                .unwrap()
                .contains("not a PEM public key")
        );
        let garbled = b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert!(public_key(garbled).is_err());
        for name in ["rsa", "p256", "p384", "ed25519"] {
            assert!(public_key(&pair(name).1).is_ok(), "{name}");
        }
        // Another curve is refused at start-up, not with every token.
        let k1 = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/jwt/secp256k1.pub.pem"
        );
        assert_eq!(
            public_key(&std::fs::read(k1).unwrap()).err().as_deref(),
            Some("an EC key on a curve other than P-256 or P-384")
        );
        assert!(Verifier::new("", None, false, "", "").is_err());
    }

    /// The private half of the fixture key pair `name`, and the algorithm
    /// its kind fits first.
    fn private_key(name: &str) -> (EncodingKey, Algorithm) {
        let private = pair(name).0;
        match name {
            "rsa" => (EncodingKey::from_rsa_pem(&private).unwrap(), Algorithm::RS256),
            "p256" => (EncodingKey::from_ec_pem(&private).unwrap(), Algorithm::ES256),
            "p384" => (EncodingKey::from_ec_pem(&private).unwrap(), Algorithm::ES384),
            _ => (EncodingKey::from_ed_pem(&private).unwrap(), Algorithm::EdDSA),
        }
    }

    /// The JWK of the fixture key pair `name`, with `kid` (if any), and
    /// its `alg` left out unless given.
    fn jwk(name: &str, kid: Option<&str>, alg: Option<Algorithm>) -> serde_json::Value {
        let (key, fits) = private_key(name);
        let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&key, alg.unwrap_or(fits)).unwrap();
        if alg.is_none() {
            jwk.common.key_algorithm = None;
        }
        jwk.common.key_id = kid.map(str::to_owned);
        serde_json::to_value(jwk).unwrap()
    }

    /// A token for `foo`, valid for a minute, signed in `alg` with the
    /// fixture key `name`, its header naming `kid`.
    fn signed_by(name: &str, alg: Algorithm, kid: Option<&str>) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        let claims = Claims {
            sub: Some("foo".into()),
            exp: since_epoch().as_secs() + 60,
            ..Claims::default()
        };
        jsonwebtoken::encode(&header, &claims, &private_key(name).0).unwrap()
    }

    fn jwks_verifier(secret: &str, keys: &[serde_json::Value]) -> Verifier {
        let v = Verifier::new(secret, None, true, "", "").unwrap();
        let document = serde_json::json!({ "keys": keys }).to_string();
        v.jwks().unwrap().install(document.as_bytes()).unwrap();
        v
    }

    #[test]
    fn a_jwks_key_is_chosen_by_kid_and_decides_its_algorithm() {
        use Algorithm::*;
        let v = jwks_verifier(
            "",
            &[
                jwk("rsa", Some("r1"), None),
                jwk("p256", Some("e1"), None),
                jwk("ed25519", Some("d1"), Some(EdDSA)),
                jwk("p384", Some("e2"), Some(ES384)),
            ],
        );
        assert_eq!(v.jwks().unwrap().len(), 4);
        for alg in [RS256, RS512, PS256] {
            assert!(
                matches!(
                    v.verify(&signed_by("rsa", alg, Some("r1")), "foo"),
                    Verdict::Valid(_)
                ),
                "{alg:?}"
            );
        }
        assert!(matches!(
            v.verify(&signed_by("p256", ES256, Some("e1")), "foo"),
            Verdict::Valid(_)
        ));
        assert!(matches!(
            v.verify(&signed_by("p384", ES384, Some("e2")), "foo"),
            Verdict::Valid(_)
        ));
        assert!(matches!(
            v.verify(&signed_by("ed25519", EdDSA, Some("d1")), "foo"),
            Verdict::Valid(_)
        ));
        // Another key's kid: its signature does not match.
        assert_eq!(
            v.verify(&signed_by("rsa", RS256, Some("e1")), "foo"),
            Verdict::Refused("token alg RS256 is not accepted (ES256 only)".to_owned())
        );
        assert_eq!(
            v.verify(&signed_by("p256", ES256, Some("r1")), "foo"),
            Verdict::Refused(
                "token alg ES256 is not accepted (accepted: RS256, RS384, RS512, PS256, PS384, PS512)"
                    .to_owned()
            )
        );
        // A kid not held asks for a fetch; the same refused by `check`.
        let rotated = signed_by("rsa", RS256, Some("r2"));
        assert_eq!(v.verify(&rotated, "foo"), Verdict::UnknownKid("r2".to_owned()));
        assert_eq!(
            v.check(&rotated, "foo").unwrap_err(),
            "token kid \"r2\" names none of auth.jwks_url's keys"
        );
        // The claims rule is the same.
        assert!(
            v.check(&signed_by("rsa", RS256, Some("r1")), "bar")
                .unwrap_err()
                .contains("not for id")
        );
    }

    #[test]
    fn a_jwks_never_lends_a_symmetric_key_and_none_is_never_an_algorithm() {
        use base64::Engine as _;
        let (_, rsa_pub) = pair("rsa");
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"s3cret");
        let v = jwks_verifier(
            "",
            &[
                jwk("rsa", Some("r1"), None),
                serde_json::json!({ "kty": "oct", "kid": "o1", "k": secret }),
            ],
        );
        assert_eq!(v.jwks().unwrap().len(), 1, "the oct key is skipped");
        // HS256 signed with the published key's secret, or the RSA public
        // key as an HMAC secret: refused by its alg, whatever its kid.
        let claims = serde_json::json!({ "sub": "foo", "exp": since_epoch().as_secs() + 60 });
        for kid in ["o1", "r1"] {
            let hs = forged(serde_json::json!({ "alg": "HS256", "kid": kid }), claims.clone());
            let why = v.check(&hs, "foo").unwrap_err();
            assert!(why.starts_with("token alg HS256 is not accepted"), "{kid}: {why}");
        }
        let confused = {
            let mut h = Header::new(Algorithm::HS256);
            h.kid = Some("r1".into());
            jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(&rsa_pub).unwrap()).unwrap()
        };
        assert!(
            v.check(&confused, "foo")
                .unwrap_err()
                .starts_with("token alg HS256 is not accepted")
        );
        let none = forged(serde_json::json!({ "alg": "none", "kid": "r1" }), claims.clone());
        assert!(
            v.check(&none, "foo")
                .unwrap_err()
                .starts_with("token alg none is not accepted")
        );
        // With a secret beside the JWKS, HS256 is taken, but only as the
        // secret signs it: the published key as a secret does not match.
        let both = jwks_verifier("s3cret", &[jwk("rsa", Some("r1"), None)]);
        assert_eq!(
            both.check(&confused, "foo").unwrap_err(),
            "token signature does not match"
        );
        let signed = forged(serde_json::json!({ "alg": "HS256", "kid": "r1" }), claims);
        assert!(
            both.check(&signed, "foo").is_ok(),
            "signed with the secret itself"
        );
    }

    #[test]
    fn a_jwks_with_no_usable_key_changes_nothing() {
        let v = jwks_verifier("", &[jwk("rsa", Some("r1"), None)]);
        let keys = v.jwks().unwrap();
        let mut enc = jwk("p256", Some("e1"), None);
        enc["use"] = "enc".into();
        let mut wrong = jwk("p256", Some("e2"), None);
        wrong["alg"] = "RS256".into();
        for document in [
            "not json".to_owned(),
            r#"{"keys": []}"#.to_owned(),
            serde_json::json!({ "keys": [enc, wrong, { "kty": "EC", "crv": "P-521", "x": "AA", "y": "AA" }] }).to_string(),
        ] {
            assert!(keys.install(document.as_bytes()).is_err(), "{document}");
            assert!(keys.knows("r1"), "{document}");
        }
        // A document with some usable keys is taken, and says what it skipped.
        let mut enc = jwk("p256", Some("e1"), None);
        enc["use"] = "enc".into();
        let doc = serde_json::json!({ "keys": [jwk("p384", Some("e3"), None), enc] }).to_string();
        let (taken, skipped) = keys.install(doc.as_bytes()).unwrap();
        assert_eq!(taken, 1);
        assert!(
            skipped[0].contains("\"e1\"") && skipped[0].contains("encryption"),
            "{skipped:?}"
        );
        assert!(!keys.knows("r1"), "replaced whole");
    }

    #[test]
    fn tokens_without_a_kid_and_keys_beside_the_jwks() {
        use Algorithm::*;
        // The secret, and a JWKS key without a kid: a token without a kid
        // is checked with the key its alg fits.
        let v = jwks_verifier("s3cret", &[jwk("rsa", None, None), jwk("p256", Some("e1"), None)]);
        let hs = mint("s3cret", &["foo".into()], Duration::from_secs(60)).unwrap();
        assert!(v.check(&hs, "foo").is_ok());
        assert!(v.check(&signed_by("rsa", RS256, None), "foo").is_ok());
        // No kid and no key without one of its kind.
        assert_eq!(
            v.check(&signed_by("p256", ES256, None), "foo").unwrap_err(),
            "token has no kid, and auth.jwks_url has no key of its kind without one"
        );
        // An HS256 token with a kid is the secret's.
        let mut h = Header::new(HS256);
        h.kid = Some("e1".into());
        let claims = serde_json::json!({ "sub": "foo", "exp": since_epoch().as_secs() + 60 });
        let hs_kid =
            jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(b"s3cret").unwrap()).unwrap();
        assert!(v.check(&hs_kid, "foo").is_ok());
        // A public key beside the JWKS: its tokens with a kid the JWKS
        // does not have still pass with it; another key's ask for a fetch.
        let both = Verifier::new("", Some(public_key(&pair("rsa").1).unwrap()), true, "", "").unwrap();
        assert!(matches!(
            both.verify(&signed_by("rsa", RS256, Some("pem")), "foo"),
            Verdict::Valid(_)
        ));
        assert!(matches!(
            both.verify(&signed_by("p256", ES256, Some("e9")), "foo"),
            Verdict::UnknownKid(_)
        ));
        // A JWKS alone, empty yet: every asymmetric token asks.
        let empty = Verifier::new("", None, true, "", "").unwrap();
        assert!(matches!(
            empty.verify(&signed_by("rsa", RS256, Some("r1")), "foo"),
            Verdict::UnknownKid(_)
        ));
        assert!(
            empty
                .check(&hs, "foo")
                .unwrap_err()
                .starts_with("token alg HS256 is not accepted")
        );
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
