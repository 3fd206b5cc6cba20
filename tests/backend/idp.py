#!/usr/bin/env python3
"""An identity provider's two halves, with PyJWT (another language's JWT
library than the server's), for tests/backend.rs.

  idp.py jwks NAME:KID ...            the JWKS of the fixture public keys
                                      (tests/fixtures/jwt/NAME.pub.pem)
  idp.py token NAME ALG KID SUB AUD   a token for SUB, valid 10 minutes,
                                      signed in ALG with NAME.key.pem, its
                                      header naming KID ("-": none), its
                                      aud AUD ("-": none)
"""

import json
import os
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "jwt")


def pem(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def jwk(name, kid):
    public = serialization.load_pem_public_key(pem(f"{name}.pub.pem"))
    algorithm = {
        "rsa": jwt.algorithms.RSAAlgorithm,
        "p256": jwt.algorithms.ECAlgorithm,
        "p384": jwt.algorithms.ECAlgorithm,
        "ed25519": jwt.algorithms.OKPAlgorithm,
    }[name]
    key = algorithm.to_jwk(public, as_dict=True)
    key["kid"] = kid
    key["use"] = "sig"
    return key


def main():
    if sys.argv[1] == "jwks":
        keys = [jwk(*spec.split(":", 1)) for spec in sys.argv[2:]]
        print(json.dumps({"keys": keys}))
    elif sys.argv[1] == "token":
        name, alg, kid, sub, aud = sys.argv[2:7]
        now = int(time.time())
        claims = {"sub": sub, "iat": now, "exp": now + 600, "iss": "https://id.example/"}
        if aud != "-":
            claims["aud"] = aud
        headers = {"kid": kid} if kid != "-" else None
        print(jwt.encode(claims, pem(f"{name}.key.pem"), algorithm=alg, headers=headers))


if __name__ == "__main__":
    main()
