#!/bin/sh
# Renders deploy/nginx.conf.template into a working nginx.conf and runs nginx (the compose `lb`
# service), or only renders it (`lb-entrypoint.sh render`, used by tests/e2e/test_topology.py).
#
# nginx OSS resolves upstream host names once, when it loads its configuration, and cannot
# discover compose replicas by itself. So the upstream list is written from the replica count
# (INGRESS_REPLICAS names <INGRESS_HOST_PREFIX><i>:<INGRESS_PORT>, i = 1..N: compose names
# replica i of service `ingress` in project P `P-ingress-i`, and Docker's DNS resolves it), or
# taken verbatim from LB_UPSTREAMS ("host:port host:port ..."). While nginx runs, a watcher
# re-resolves those names every LB_RESOLVE_INTERVAL_S seconds and reloads nginx when an address
# changed (a replica that was recreated); the hash ring is built from the names, so a reload
# moves no session.
#
# With LB_DRIVER_LISTEN set, a second server listens there for the rollout driver and proxies to
# the replicas' driver listeners (INGRESS_DRIVER_PORT, or LB_DRIVER_UPSTREAMS verbatim), hashed on
# the session like the scaffold server, so a session's second end meets the replica that took the
# first. Publish it where only the driver reaches it (compose: loopback by default).
set -eu

INGRESS_REPLICAS="${INGRESS_REPLICAS:-2}"
INGRESS_HOST_PREFIX="${INGRESS_HOST_PREFIX:-titoflow-ingress-}"
INGRESS_PORT="${INGRESS_PORT:-8000}"
LB_UPSTREAMS="${LB_UPSTREAMS:-}"
LB_DRIVER_LISTEN="${LB_DRIVER_LISTEN:-}"
INGRESS_DRIVER_PORT="${INGRESS_DRIVER_PORT:-8001}"
LB_DRIVER_UPSTREAMS="${LB_DRIVER_UPSTREAMS:-}"
LB_LISTEN="${LB_LISTEN:-8080}"
LB_TEMPLATE="${LB_TEMPLATE:-/etc/titoflow/nginx.conf.template}"
LB_CONF_DIR="${LB_CONF_DIR:-/etc/nginx}"
LB_TEMP_DIR="${LB_TEMP_DIR:-/var/cache/nginx/titoflow}"
LB_MAX_BODY_BYTES="${LB_MAX_BODY_BYTES:-33554432}"
LB_PROXY_TIMEOUT_S="${LB_PROXY_TIMEOUT_S:-900}"
LB_MAX_FAILS="${LB_MAX_FAILS:-1}"
LB_FAIL_TIMEOUT_S="${LB_FAIL_TIMEOUT_S:-10}"
LB_RESOLVE_INTERVAL_S="${LB_RESOLVE_INTERVAL_S:-10}"

# upstream_names [verbatim list] [port]: the replicas' host:port names.
upstream_names() {
    verbatim="${1-$LB_UPSTREAMS}"
    port="${2:-$INGRESS_PORT}"
    if [ -n "$verbatim" ]; then
        for server in $verbatim; do echo "$server"; done
        return
    fi
    i=1
    while [ "$i" -le "$INGRESS_REPLICAS" ]; do
        echo "${INGRESS_HOST_PREFIX}${i}:${port}"
        i=$((i + 1))
    done
}

server_lines() {
    for server in $(upstream_names "$@"); do
        echo "server $server max_fails=$LB_MAX_FAILS fail_timeout=${LB_FAIL_TIMEOUT_S}s;"
    done
}

# The driver plane's upstream and server, or an empty file without LB_DRIVER_LISTEN.
driver_conf() {
    [ -n "$LB_DRIVER_LISTEN" ] || return 0
    echo "upstream titoflow_driver {"
    echo "    hash \$titoflow_session_key consistent;"
    server_lines "$LB_DRIVER_UPSTREAMS" "$INGRESS_DRIVER_PORT" | sed 's/^/    /'
    echo "    keepalive 16;"
    echo "    keepalive_timeout 4s;"
    echo "}"
    echo "server {"
    echo "    listen $LB_DRIVER_LISTEN;"
    echo "    client_max_body_size $LB_MAX_BODY_BYTES;"
    echo "    location / {"
    echo "        proxy_pass http://titoflow_driver;"
    echo "        proxy_http_version 1.1;"
    echo "        proxy_set_header Connection \"\";"
    echo "        proxy_set_header Host \$http_host;"
    echo "        proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;"
    echo "        proxy_read_timeout ${LB_PROXY_TIMEOUT_S}s;"
    echo "        proxy_next_upstream error timeout;"
    echo "    }"
    echo "}"
}

render() {
    mkdir -p "$LB_CONF_DIR" "$LB_TEMP_DIR"
    upstreams_file="$LB_CONF_DIR/titoflow-upstreams.conf"
    driver_file="$LB_CONF_DIR/titoflow-driver.conf"
    server_lines >"$upstreams_file"
    driver_conf >"$driver_file"
    if [ ! -s "$upstreams_file" ]; then
        echo "lb-entrypoint: no upstream servers (INGRESS_REPLICAS=$INGRESS_REPLICAS)" >&2
        exit 1
    fi
    sed -e "s|@LISTEN@|$LB_LISTEN|g" \
        -e "s|@UPSTREAMS_FILE@|$upstreams_file|g" \
        -e "s|@DRIVER_FILE@|$driver_file|g" \
        -e "s|@TEMP_DIR@|$LB_TEMP_DIR|g" \
        -e "s|@MAX_BODY_BYTES@|$LB_MAX_BODY_BYTES|g" \
        -e "s|@PROXY_TIMEOUT@|${LB_PROXY_TIMEOUT_S}s|g" \
        "$LB_TEMPLATE" >"$LB_CONF_DIR/nginx.conf"
    echo "$LB_CONF_DIR/nginx.conf"
}

# The addresses the upstream names resolve to now, or nothing if one of them does not resolve.
addresses() {
    out=""
    for server in $(upstream_names); do
        host="${server%:*}"
        address="$(getent hosts "$host" | awk '{print $1}' | sort | tr '\n' ',')"
        [ -n "$address" ] || return 0
        out="$out $host=$address"
    done
    echo "$out"
}

watch_addresses() {
    last="$(addresses)"
    while sleep "$LB_RESOLVE_INTERVAL_S"; do
        now="$(addresses)"
        if [ -n "$now" ] && [ "$now" != "$last" ]; then
            echo "lb-entrypoint: upstream addresses changed ($now), reloading nginx" >&2
            nginx -c "$LB_CONF_DIR/nginx.conf" -s reload && last="$now"
        fi
    done
}

case "${1:-run}" in
render)
    render
    ;;
run)
    render >/dev/null
    nginx -c "$LB_CONF_DIR/nginx.conf" -t
    watch_addresses &
    exec nginx -c "$LB_CONF_DIR/nginx.conf" -g "daemon off;"
    ;;
*)
    echo "usage: lb-entrypoint.sh [run|render]" >&2
    exit 2
    ;;
esac
