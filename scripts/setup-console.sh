#!/usr/bin/env bash
# The web console's assets. Idempotent and quick when done:
#
#  * Chart.js, xterm.js and its fit addon, from the npm registry, into
#    app/api/console/static/vendor (served by the gateway itself: no CDN, machines may
#    have no internet), each with its LICENSE; without npm the console still works, its
#    usage page shows the table without the chart, a sandbox's page has no terminal;
#  * with --browser (the tests): Debian's chromium, which Playwright drives.
set -euo pipefail

cd "$(dirname "$0")/.."

CHART_JS_VERSION=4.6.1
vendor=app/api/console/static/vendor
if [[ ! -f "$vendor/chart.js/dist/chart.umd.js" ]] || \
   ! grep -q "\"version\": \"$CHART_JS_VERSION\"" "$vendor/chart.js/package.json" 2>/dev/null; then
    if command -v npm >/dev/null; then
        tmp=$(mktemp -d)
        trap 'rm -rf "$tmp"' EXIT
        (cd "$tmp" && npm pack --silent "chart.js@$CHART_JS_VERSION" >/dev/null)
        rm -rf "$vendor/chart.js"
        mkdir -p "$vendor/chart.js"
        tar -xzf "$tmp"/chart.js-*.tgz -C "$vendor/chart.js" --strip-components=1 \
            package/package.json package/LICENSE.md package/dist/chart.umd.js
        echo "setup-console: Chart.js $CHART_JS_VERSION installed"
    else
        echo "setup-console: npm not found; the usage page will show no chart" >&2
    fi
fi

XTERM_VERSION=6.0.0
XTERM_FIT_VERSION=0.11.0
# vendor PACKAGE VERSION DIR FILES...: the files of an npm package, once per version
vendor_package() {
    local package=$1 version=$2 dir=$vendor/$3
    shift 3
    if grep -q "\"version\": \"$version\"" "$dir/package.json" 2>/dev/null; then
        return
    fi
    if ! command -v npm >/dev/null; then
        echo "setup-console: npm not found; $package not installed" >&2
        return
    fi
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$package@$version" >/dev/null)
    rm -rf "$dir"
    mkdir -p "$dir"
    tar -xzf "$tmp"/*.tgz -C "$dir" --strip-components=1 package/package.json "$@"
    rm -rf "$tmp"
    echo "setup-console: $package $version installed"
}
vendor_package @xterm/xterm "$XTERM_VERSION" xterm package/LICENSE package/lib/xterm.js \
    package/css/xterm.css
vendor_package @xterm/addon-fit "$XTERM_FIT_VERSION" xterm-addon-fit package/LICENSE \
    package/lib/addon-fit.js

if [[ "${1:-}" == "--browser" ]]; then
    scripts/apt-ensure setup-console chromium
fi
echo "setup-console: done"
