#!/usr/bin/env bash
# Makes throwaway TLS material for trying foqs out and for the tests (never for production):
#   scripts/certs.sh DIR [CLIENT_NAME...]
# writes into DIR:
#   ca.pem, ca.key            a CA (EC P-256, valid 30 days)
#   server.pem, server.key    a server certificate for 127.0.0.1, ::1 and localhost
#   NAME.pem, NAME.key        for each CLIENT_NAME, a client certificate whose identity
#                             (first DNS SAN and CN) is NAME; a NAME starting "rsa-" gets
#                             an RSA key in PKCS#1 PEM (what mysql_async reads for a client
#                             certificate to MySQL)
#   other-ca.pem, intruder.pem, intruder.key   a second CA and a client certificate it
#                             signed (identity "intruder"), to see a handshake refused
#   revoked.pem, revoked.key, crl.pem   a client certificate of ca (identity "revoked")
#                             and ca's revocation list, which revokes it
#   peer-ca.pem, peer-host-1.pem/.key, peer-host-2.pem/.key   the hosts' own CA and its
#                             certificates with identities host-1 and host-2
# Keys are PKCS#8 PEM (but rsa-* ones). Uses the openssl command (installed from Debian when missing).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 DIR [CLIENT_NAME...]" >&2; exit 2; }
dir=$1; shift
command -v openssl >/dev/null 2>&1 || foqs_apt_install openssl
mkdir -p "$dir"
cd "$dir"

key() {
  case "$(basename "$1")" in
    rsa-*) openssl genrsa -traditional -out "$1" 2048 2>/dev/null ;;
    *) openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null ;;
  esac
}

ca() { # name
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -days 30 -subj "/CN=foqs test $1" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem" 2>/dev/null
}

leaf() { # ca, name, usage, subjectAltName
  key "$2.key"
  openssl req -new -key "$2.key" -subj "/CN=$2" -out "$2.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$3" "$4" >"$2.ext"
  openssl x509 -req -in "$2.csr" -CA "$1.pem" -CAkey "$1.key" -CAcreateserial -days 30 \
    -extfile "$2.ext" -out "$2.pem" 2>/dev/null
  rm -f "$2.csr" "$2.ext"
}

ca ca
leaf ca server serverAuth "IP:127.0.0.1,IP:::1,DNS:localhost"
for name in "$@"; do
  leaf ca "$name" clientAuth "DNS:$name"
done
ca other-ca
leaf other-ca intruder clientAuth "DNS:intruder"
# The cluster's hosts' own CA, and a certificate of it for host-1 and host-2 (the same
# names as the client CA's host-N.pem, which must not make a client a peer).
ca peer-ca
leaf peer-ca peer-host-1 clientAuth "DNS:host-1"
leaf peer-ca peer-host-2 clientAuth "DNS:host-2"
# A client certificate of ca, revoked in crl.pem (the CA's revocation list).
leaf ca revoked clientAuth "DNS:revoked"
mkdir -p ca-db
: >ca-db/index.txt
echo 01 >ca-db/crlnumber
# A version 2 CRL with a number and the CA's key id, as rustls's verifier requires.
printf '[ca]\ndefault_ca = d\n[d]\ndatabase = ca-db/index.txt\ncrlnumber = ca-db/crlnumber\ndefault_md = sha256\ndefault_crl_days = 30\ncrl_extensions = crl_ext\n[crl_ext]\nauthorityKeyIdentifier = keyid:always\n' >ca-db/ca.cnf
openssl ca -config ca-db/ca.cnf -cert ca.pem -keyfile ca.key -revoke revoked.pem 2>/dev/null
openssl ca -config ca-db/ca.cnf -cert ca.pem -keyfile ca.key -gencrl -out crl.pem 2>/dev/null
rm -rf ca-db
rm -f ./*.srl
echo "certs.sh: wrote $(ls | tr '\n' ' ')into $dir" >&2
