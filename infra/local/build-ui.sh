# Argo's web UI, built from the Argo module's own ui/ (sourced by build.sh, never run): yarn 1 installs the
# lockfile's packages from the npm registry (frozen: nothing is resolved anew), webpack writes ui/dist/app, and
# build.sh then embeds it in the `argo` binary (ui/embed.go). The one dependency that is not on the registry,
# argo-ui (a git commit in package.json), comes from infra/local/argo-ui, an archive of that commit
# (infra/local/argo-ui/VENDORED.md): the copied ui/ names it as `file:./argo-ui`, in package.json and in its
# yarn.lock entry. Nothing else in Argo's UI is changed.
#
#   BATON_YARN_CACHE=DIR    yarn's package cache (default: the cluster cache's yarn-cache/, reused by every build)

YARN_VERSION=1.22.22
NODE_MIN=20   # ui/package.json, "engines"
ARGO_UI_GIT="git+https://github.com/argoproj/argo-ui.git#54f36c723d9a0e5d3386689298cbb9c27767fa00"

# ui_inputs: the files of the vendored argo-ui, for the cache key.
ui_inputs() { find "$here/argo-ui" -type f | LC_ALL=C sort; }

# need_node: exits 2 with one line unless node >= NODE_MIN and npm are on PATH.
need_node() {
  local v
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || {
    echo "error: no 'node' and 'npm' on PATH: Argo's UI is built with Node.js >= $NODE_MIN (Debian: nodejs; docs/cluster-local.md)" >&2
    exit 2
  }
  v="$(node --version | sed 's/^v//')"
  [ "${v%%.*}" -ge "$NODE_MIN" ] || { echo "error: Node.js $v is older than $NODE_MIN, which Argo's UI needs" >&2; exit 2; }
}

# first_error LOG: the line of LOG that says why yarn failed (a package it could not fetch names it).
first_error() { grep -m1 -E '^error|ERR!|Error:' "$1" | cut -c1-300; }

# build_ui UI: ui/dist/app in the copied module's ui/ folder UI, timed into the figures.
build_ui() {
  local ui="$1" yarn_dir="$root/tools/yarn-$YARN_VERSION" yarn log
  need_node
  yarn="$yarn_dir/node_modules/.bin/yarn"
  if [ ! -x "$yarn" ]; then
    echo "[build] ui: installing yarn $YARN_VERSION (npm registry) into $yarn_dir"
    log="$work/yarn-install.log"
    if ! npm install --prefix "$yarn_dir" --no-save --no-audit --no-fund "yarn@$YARN_VERSION" > "$log" 2>&1; then
      echo "error: npm could not install yarn@$YARN_VERSION: $(first_error "$log")" >&2
      exit 1
    fi
  fi
  grep -qF "\"argo-ui\": \"$ARGO_UI_GIT\"" "$ui/package.json" && grep -qF "\"argo-ui@$ARGO_UI_GIT\":" "$ui/yarn.lock" || {
    echo "error: $ui/package.json or yarn.lock does not pin argo-ui at $ARGO_UI_GIT, the commit infra/local/argo-ui holds" >&2
    exit 1
  }
  cp -r "$here/argo-ui" "$ui/argo-ui"
  sed -i "s|\"argo-ui\": \"$ARGO_UI_GIT\"|\"argo-ui\": \"file:./argo-ui\"|" "$ui/package.json"
  sed -i "/^\"argo-ui@${ARGO_UI_GIT//\//\\/}\":\$/{s|.*|\"argo-ui@file:./argo-ui\":|;n;n;/^  resolved /d}" "$ui/yarn.lock"
  # The lockfile's hosts, one line each, so that a build that cannot reach one can say which.
  echo "[build] ui: yarn install (frozen lockfile, $(grep -c '^  resolved ' "$ui/yarn.lock") packages)"
  log="$work/yarn-ui.log"
  if ! run_timed ui-install "$ui" env YARN_CACHE_FOLDER="${BATON_YARN_CACHE:-$root/yarn-cache}" \
      "$yarn" install --frozen-lockfile --ignore-optional --non-interactive --network-timeout 120000 > "$log" 2>&1; then
    echo "error: yarn install of Argo's UI failed after ${secs} s: $(first_error "$log")" >&2
    exit 1
  fi
  # shellcheck disable=SC2059
  printf "$row" "(ui install)" "$secs" "$paused" "$cpu" "$(( ${max_rss/n\/a/0} / 1024 ))" "$(( tree_peak / 1024 ))" - >> "$figures"
  echo "[build] ui: packages installed in ${secs} s; webpack (a few minutes)"
  log="$work/webpack-ui.log"
  if ! run_timed ui-webpack "$ui" env NODE_ENV=production nice "$yarn" build > "$log" 2>&1; then
    echo "error: webpack of Argo's UI failed after ${secs} s: $(first_error "$log")" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  [ -s "$ui/dist/app/index.html" ] || { echo "error: webpack wrote no $ui/dist/app/index.html" >&2; exit 1; }
  # shellcheck disable=SC2059
  printf "$row" "ui (dist/app)" "$secs" "$paused" "$cpu" "$(( ${max_rss/n\/a/0} / 1024 ))" "$(( tree_peak / 1024 ))" \
    "$(( $(du -sb "$ui/dist/app" | cut -f1) / 1048576 ))" >> "$figures"
  echo "[build] ui: built in ${secs} s, $(du -sh "$ui/dist/app" | cut -f1) in dist/app"
  rm -rf "$ui/node_modules"
}
