#!/usr/bin/env bash
# The web console's assets. Idempotent and quick when done:
#
#  * Chart.js, from the npm registry, into app/api/console/static/vendor (served by the
#    gateway itself: no CDN, machines may have no internet); without npm the console
#    still works, its usage page shows the table without the chart;
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

if [[ "${1:-}" == "--browser" ]]; then
    scripts/apt-ensure setup-console chromium
fi
echo "setup-console: done"
