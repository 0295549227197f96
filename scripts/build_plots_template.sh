#!/usr/bin/env bash
# Rebuild .dvc/plots/offline.html: DVC's plots page with vega, vega-lite and vega-embed
# inlined (the versions dvc-render asks for), so `dvc plots show/diff` HTML works offline.
# The template has no {scripts} placeholder, so DVC adds no CDN <script> tags.
# Needs npm and the npm registry; the result is committed, users need neither.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent vega@5.20.2 vega-lite@5.2.0 vega-embed@6.18.2 >/dev/null)
out=.dvc/plots/offline.html
mkdir -p "$(dirname "$out")"
{
  echo '<!DOCTYPE html>'
  echo '<html>'
  echo '<head>'
  echo '{refresh_tag}'
  echo '<meta charset="utf-8">'
  echo '<title>DVC Plot (offline)</title>'
  for pkg in vega-5.20.2 vega-lite-5.2.0 vega-embed-6.18.2; do
    mkdir -p "$work/$pkg" && tar xzf "$work/$pkg.tgz" -C "$work/$pkg"
    name=${pkg%-*}
    echo "<!-- $pkg, BSD-3-Clause: $(head -n 3 "$work/$pkg/package/LICENSE" | tr '\n' ' ') -->"
    echo '<script>'
    cat "$work/$pkg/package/build/$name.min.js"
    echo
    echo '</script>'
  done
  echo '<style>table { border-spacing: 15px; } body { font-family: sans-serif; }</style>'
  echo '</head>'
  echo '<body>'
  echo '{plot_divs}'
  echo '</body>'
  echo '</html>'
} >"$out"
echo "wrote $out ($(wc -c <"$out") bytes)"
