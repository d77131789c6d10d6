{{/*
The embedded NATS server's files (the ConfigMap's data): its configuration and, with user-password
or token auth, the script the init container runs to write the authorization block from the
Secret. Its own template so that the StatefulSet can carry a checksum of it.
*/}}
{{- define "tessera.natsConfigData" -}}
{{- $n := .Values.nats.embedded }}
{{- $auth := .Values.nats.auth }}
{{- $name := include "tessera.componentName" (dict "root" . "component" "nats") }}
{{- $headless := printf "%s-headless" $name }}
{{- $clustered := gt (int $n.replicas) 1 }}
{{- $authFile := has $auth.type (list "user-password" "token" "per-service") }}
nats.conf: |
  server_name: $POD_NAME
  listen: 0.0.0.0:4222
  http_port: 8222
  pid_file: /var/run/nats/nats.pid
  # On SIGTERM (preStop) clients are moved off gradually instead of all at once.
  lame_duck_duration: 30s
  lame_duck_grace_period: 10s
  jetstream {
    store_dir: /data
    max_memory_store: {{ $n.jetstream.maxMemoryStore }}
    max_file_store: {{ $n.jetstream.maxFileStore }}
  }
  {{- if $clustered }}
  cluster {
    name: {{ $name }}
    listen: 0.0.0.0:6222
    routes: [
      {{- range $i := until (int $n.replicas) }}
      nats://{{ $name }}-{{ $i }}.{{ $headless }}.{{ $.Release.Namespace }}.svc:6222
      {{- end }}
    ]
  }
  {{- end }}
  {{- if .Values.nats.tls.enabled }}
  tls {
    cert_file: /etc/nats/tls/tls.crt
    key_file: /etc/nats/tls/tls.key
    ca_file: /etc/nats/tls/ca.crt
    # Mutual TLS when the services have a client certificate.
    verify: {{ not (empty .Values.nats.tls.clientSecret) }}
    timeout: 5
  }
  {{- end }}
  {{- if $authFile }}
  # Written at start by the auth init container from the Secret (never stored in a ConfigMap).
  include ../auth/auth.conf
  {{- else if eq $auth.type "nkey" }}
  authorization {
    users: [
      { nkey: {{ $auth.nkeyPublicKey | quote }} }
    ]
  }
  {{- end }}
{{- if eq $auth.type "per-service" }}
# Each Tessera service's subject permissions (files/nats-permissions.conf, generated from
# shared/permissions.py); auth.sh puts them before the users that refer to them. The per-node
# services' identities speak for every node ("*" for the node).
permissions.conf: |
  {{- .Files.Get "files/nats-permissions.conf" | replace "__NODE__" "*" | nindent 2 }}
{{- end }}
{{- if $authFile }}
# Writes the server's authorization block from the mounted Secret. Values are quoted and
# escaped, so any password or token works (digits only, spaces, quotes, backslashes); NATS's own
# $VARIABLE substitution would parse "12345" as a number and "a b" as two tokens.
auth.sh: |
  set -eu
  secret=/etc/nats/secret
  out=/etc/nats/auth/auth.conf
  quote() { printf '"%s"' "$(sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' "$secret/$1")"; }
  {
    {{- if eq $auth.type "per-service" }}
    cat /etc/nats/config/permissions.conf
    {{- end }}
    printf '%s\n' 'authorization {'
    {{- if eq $auth.type "per-service" }}
    printf '%s\n' '  users = ['
    {{- range $role := include "tessera.natsRoles" . | fromJsonArray }}
    printf '    { user: "{{ $role }}", password: %s, permissions: ${{ printf "PERMISSIONS_%s" (upper $role) }} }\n' "$(quote {{ $role }})"
    {{- end }}
    printf '%s\n' '  ]'
    {{- else if eq $auth.type "user-password" }}
    printf '  user: %s\n' "$(quote user)"
    printf '  password: %s\n' "$(quote password)"
    {{- else }}
    printf '  token: %s\n' "$(quote token)"
    {{- end }}
    printf '%s\n' '}'
  } >"$out"
{{- end }}
{{- end }}
