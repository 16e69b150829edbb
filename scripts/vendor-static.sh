#!/bin/sh
# Vendors the chat page's browser libraries into static/vendor/<lib>-<version>/ from the npm registry.
#
# The pinned versions below are the only place they are chosen. The files it writes are committed, so
# a fresh machine or CI serves them without npm; run this again only to change a version (then update
# the <script>/<link> tags in templates/conversations/_renderer*.html and admin/operations.html, and the
# README's libraries table).
# Each package is fetched with `npm pack` (the published tarball, no install scripts run) and only its
# browser build and licence files are copied.
set -eu

MARKDOWN_IT=15.0.3
DOMPURIFY=3.5.0
HIGHLIGHT_JS=11.12.0           # @highlightjs/cdn-assets: highlight.js's own prebuilt browser bundle
KATEX=0.19.1
MARKDOWN_IT_KATEX=1.1.2        # @vscode/markdown-it-katex: the $…$ / $$…$$ rules, rendered by KaTeX
UPLOT=1.6.32                   # the operations page's charts (templates/admin/operations.html)

root=$(cd "$(dirname "$0")/.." && pwd)
vendor="$root/static/vendor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# unpack <package@version> <dir>: the package's tarball, unpacked into $work/<dir>.
unpack() {
    mkdir -p "$work/$2"
    (cd "$work" && npm pack --silent "$1" >"$2.name")
    tar xzf "$work/$(cat "$work/$2.name")" -C "$work/$2" --strip-components=1
}

# fresh <dir>: an empty static/vendor/<dir>, older versions of the same library removed.
fresh() {
    rm -rf "$vendor/${1%-*}"-[0-9]*
    mkdir -p "$vendor/$1"
    echo "$vendor/$1"
}

unpack "markdown-it@$MARKDOWN_IT" markdown-it
out=$(fresh "markdown-it-$MARKDOWN_IT")
cp "$work/markdown-it/dist/browser/markdown-it.umd.min.js" "$work/markdown-it/LICENSE" "$out/"

unpack "dompurify@$DOMPURIFY" dompurify
out=$(fresh "dompurify-$DOMPURIFY")
cp "$work/dompurify/dist/purify.min.js" "$work/dompurify/LICENSE" "$work/dompurify/LICENSE-MPL" "$out/"

unpack "@highlightjs/cdn-assets@$HIGHLIGHT_JS" highlight.js
out=$(fresh "highlight.js-$HIGHLIGHT_JS")
# Its GitHub styles, light and dark: templates/conversations/_renderer_styles.html picks by the theme.
cp "$work/highlight.js/highlight.min.js" "$work/highlight.js/LICENSE" "$work/highlight.js/styles/github.min.css" \
    "$work/highlight.js/styles/github-dark.min.css" "$out/"

unpack "katex@$KATEX" katex
out=$(fresh "katex-$KATEX")
cp "$work/katex/dist/katex.min.js" "$work/katex/dist/katex.min.css" "$work/katex/LICENSE" "$out/"
# Every browser the page supports reads woff2, the first format katex.min.css offers.
mkdir -p "$out/fonts"
cp "$work/katex/dist/fonts/"*.woff2 "$out/fonts/"

# The plugin is published as one CommonJS file whose only import is katex: wrapped here so that it
# runs as a plain script, taking the katex global and leaving window.markdownItKatex.
unpack "@vscode/markdown-it-katex@$MARKDOWN_IT_KATEX" markdown-it-katex
out=$(fresh "markdown-it-katex-$MARKDOWN_IT_KATEX")
cp "$work/markdown-it-katex/LICENSE" "$out/"
{
    echo "/* @vscode/markdown-it-katex $MARKDOWN_IT_KATEX (MIT), wrapped by scripts/vendor-static.sh as a plain script. */"
    echo "(function () {"
    echo "var exports = {};"
    echo "function require(name) { if (name === \"katex\") return window.katex; throw new Error(\"no module \" + name); }"
    grep -v '^//# sourceMappingURL=' "$work/markdown-it-katex/dist/index.js"
    echo
    echo "window.markdownItKatex = exports.default;"
    echo "})();"
} >"$out/markdown-it-katex.js"

unpack "uplot@$UPLOT" uplot
out=$(fresh "uplot-$UPLOT")
cp "$work/uplot/dist/uPlot.iife.min.js" "$work/uplot/dist/uPlot.min.css" "$work/uplot/LICENSE" "$out/"

echo "vendored into $vendor:"
ls "$vendor"
