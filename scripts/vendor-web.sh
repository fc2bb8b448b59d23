#!/usr/bin/env bash
# Vendors the browser libraries of the web page into web/vendor/ (committed, so building and
# running `mira serve` needs no network and no build step): xterm.js and its fit addon, at the
# pinned versions below, fetched from the npm registry with `npm pack` (which checks the
# registry's integrity hash), then checked again against the pinned SHA-512 here.
# Only the ES-module builds, the stylesheet and the licences are copied.
# Run it again after changing a version; commit web/vendor/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

XTERM_VERSION=6.0.0
XTERM_SHA512=TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==
FIT_VERSION=0.11.0
FIT_SHA512=jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g==

cache="$root/.cache/vendor-web"
mkdir -p "$cache"

fetch() { # PACKAGE VERSION SHA512 → prints the unpacked folder
  local pkg=$1 version=$2 sha=$3 tgz dir
  tgz="$cache/$(echo "$pkg" | tr -d @ | tr / -)-$version.tgz"
  if [ ! -f "$tgz" ]; then
    (cd "$cache" && npm pack --silent --cache "$root/.cache/npm" "$pkg@$version" >/dev/null)
    mv "$cache/$(echo "$pkg" | tr -d @ | tr / -)-$version.tgz" "$tgz" 2>/dev/null || true
  fi
  [ -f "$tgz" ] || { echo "vendor-web: npm pack $pkg@$version produced no $tgz" >&2; exit 1; }
  local got
  got=$(openssl dgst -sha512 -binary "$tgz" | openssl base64 -A)
  if [ "$got" != "$sha" ]; then
    echo "vendor-web: $pkg@$version has sha512-$got, expected sha512-$sha" >&2
    exit 1
  fi
  dir="$cache/$(basename "$tgz" .tgz)"
  rm -rf "$dir" && mkdir -p "$dir"
  tar -xzf "$tgz" -C "$dir" --strip-components=1
  echo "$dir"
}

xterm=$(fetch @xterm/xterm "$XTERM_VERSION" "$XTERM_SHA512")
fit=$(fetch @xterm/addon-fit "$FIT_VERSION" "$FIT_SHA512")

out=web/vendor/xterm
rm -rf "$out" && mkdir -p "$out"
cp "$xterm/lib/xterm.mjs" "$out/xterm.mjs"
cp "$xterm/css/xterm.css" "$out/xterm.css"
cp "$xterm/LICENSE" "$out/LICENSE"
cp "$fit/lib/addon-fit.mjs" "$out/addon-fit.mjs"
cp "$fit/LICENSE" "$out/LICENSE.addon-fit"
# Source maps are not shipped: drop the comments that point at them (avoids 404s in devtools).
sed -i '/^\/\/# sourceMappingURL=/d' "$out/xterm.mjs" "$out/addon-fit.mjs"
cat >"$out/VERSIONS" <<VERSIONS
@xterm/xterm $XTERM_VERSION sha512-$XTERM_SHA512
@xterm/addon-fit $FIT_VERSION sha512-$FIT_SHA512
VERSIONS
echo "vendor-web: wrote $out ($(du -sh "$out" | cut -f1))" >&2
