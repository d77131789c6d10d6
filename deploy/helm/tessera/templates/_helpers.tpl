{{/*
Names, labels and the pieces every Tessera container shares: its arguments (settings as
`--<setting>=<value>`), the NATS credential and TLS files, probes and security context.
*/}}

{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<component>", for objects of one component. */}}
{{- define "tessera.componentName" -}}
{{- printf "%s-%s" (include "tessera.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tessera.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The extender's kube-scheduler image tag: extender.scheduler.image.tag, else the cluster's own
version (a kube-scheduler must match its control plane), vMAJOR.MINOR.PATCH without a provider's
suffix (v1.31.2-eks-1234 -> v1.31.2).
*/}}
{{- define "tessera.kubeSchedulerTag" -}}
{{- with .Values.extender.scheduler.image.tag }}
{{- . }}
{{- else }}
{{- $v := semver .Capabilities.KubeVersion.Version }}
{{- printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch }}
{{- end }}
{{- end }}

{{/* Whether the chart runs its own NATS. */}}
{{- define "tessera.natsEmbedded" -}}
{{- if not .Values.nats.url }}true{{ end }}
{{- end }}

{{- define "tessera.natsHost" -}}
{{- printf "%s.%s.svc" (include "tessera.componentName" (dict "root" . "component" "nats")) .Release.Namespace }}
{{- end }}

{{/* The URL every service connects to. */}}
{{- define "tessera.natsUrl" -}}
{{- if .Values.nats.url }}
{{- .Values.nats.url }}
{{- else }}
{{- printf "%s://%s:4222" (ternary "tls" "nats" .Values.nats.tls.enabled) (include "tessera.natsHost" .) }}
{{- end }}
{{- end }}

{{/*
Copies of each JetStream stream and KV bucket the services keep (--nats-replicas): the
embedded NATS's server count (a server lost loses nothing), else nats.streamReplicas (1 for an
existing single server).
*/}}
{{- define "tessera.natsReplicas" -}}
{{- if .Values.nats.streamReplicas }}
{{- .Values.nats.streamReplicas }}
{{- else if .Values.nats.url }}1
{{- else }}
{{- int .Values.nats.embedded.replicas }}
{{- end }}
{{- end }}

{{/* The Secret holding the NATS credentials (existing or chart-created). */}}
{{- define "tessera.natsAuthSecret" -}}
{{- .Values.nats.auth.existingSecret | default (include "tessera.componentName" (dict "root" . "component" "nats-auth")) }}
{{- end }}

{{/*
The Tessera services that log in to NATS, each as itself with nats.auth.type=per-service (the
roles of shared/permissions.py; the chart's tests check the two lists agree).
*/}}
{{- define "tessera.natsRoles" -}}
{{- list "placer" "binder" "dashboard" "inventory" "deviceplugin" "webhook" | toJson }}
{{- end }}

{{/*
The one credential file a service reads for nats.auth.type: its Secret key and the setting
that names the file. Takes root and service. user-password also sends the user name (through
secretKeyRef); per-service, the service's own password (its user name is the service's).
*/}}
{{- define "tessera.natsAuthFile" -}}
{{- $auth := .root.Values.nats.auth }}
{{- if eq $auth.type "per-service" }}
{{- dict "key" .service "setting" "nats-password-file" | toJson }}
{{- else if eq $auth.type "user-password" }}
{{- dict "key" $auth.secretKeys.password "setting" "nats-password-file" | toJson }}
{{- else if eq $auth.type "token" }}
{{- dict "key" $auth.secretKeys.token "setting" "nats-token-file" | toJson }}
{{- else if eq $auth.type "nkey" }}
{{- dict "key" $auth.secretKeys.nkeySeed "setting" "nats-nkey-seed-file" | toJson }}
{{- else if eq $auth.type "creds" }}
{{- dict "key" $auth.secretKeys.creds "setting" "nats-creds-file" | toJson }}
{{- else }}
{{- dict | toJson }}
{{- end }}
{{- end }}

{{- define "tessera.natsAuthDir" -}}/etc/tessera/nats/auth{{- end }}
{{- define "tessera.natsCaDir" -}}/etc/tessera/nats/ca{{- end }}
{{- define "tessera.natsClientCertDir" -}}/etc/tessera/nats/client{{- end }}

{{/*
Arguments of a Tessera container, as a JSON list: the service name (the image's entrypoint is
`tessera`), the settings every service has, the NATS credential/TLS files (not with noNats),
then the service's own ("args") and the operator's ("extraArgs"). Only
file paths reach the command line, never secrets.
*/}}
{{- define "tessera.args" -}}
{{- $v := .root.Values -}}
{{- $args := list .service -}}
{{- if not .noNats -}}
{{- $args = concat $args (list (printf "--nats-url=%s" (include "tessera.natsUrl" .root)) (printf "--nats-replicas=%s" (include "tessera.natsReplicas" .root))) -}}
{{- end -}}
{{- $args = concat $args (list (printf "--http-port=%v" $v.httpPort) (printf "--log-level=%s" $v.logLevel) (printf "--log-format=%s" $v.logFormat)) -}}
{{- if not .noNats -}}
{{- $file := include "tessera.natsAuthFile" . | fromJson -}}
{{- if $file.setting -}}
{{- $args = append $args (printf "--%s=%s/%s" $file.setting (include "tessera.natsAuthDir" .root) $file.key) -}}
{{- end -}}
{{- if $v.nats.tls.enabled -}}
{{- if include "tessera.natsCaSecret" .root -}}
{{- $args = append $args (printf "--nats-tls-ca-file=%s/%s" (include "tessera.natsCaDir" .root) $v.nats.tls.caKey) -}}
{{- end -}}
{{- if $v.nats.tls.clientSecret -}}
{{- $args = append $args (printf "--nats-tls-cert-file=%s/tls.crt" (include "tessera.natsClientCertDir" .root)) -}}
{{- $args = append $args (printf "--nats-tls-key-file=%s/tls.key" (include "tessera.natsClientCertDir" .root)) -}}
{{- end -}}
{{- if $v.nats.tls.serverName -}}
{{- $args = append $args (printf "--nats-tls-server-name=%s" $v.nats.tls.serverName) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- concat $args (.args | default list) (.extraArgs | default list) | toJson -}}
{{- end }}

{{/*
Environment every Tessera container gets, as a JSON list: the NATS user (from the Secret with
user-password; the service's own name with per-service). Takes root and service.
*/}}
{{- define "tessera.natsEnv" -}}
{{- $env := list -}}
{{- $v := .root.Values -}}
{{- if eq $v.nats.auth.type "user-password" -}}
{{- $ref := dict "name" (include "tessera.natsAuthSecret" .root) "key" $v.nats.auth.secretKeys.user -}}
{{- $env = append $env (dict "name" "TESSERA_NATS_USER" "valueFrom" (dict "secretKeyRef" $ref)) -}}
{{- else if eq $v.nats.auth.type "per-service" -}}
{{- $env = append $env (dict "name" "TESSERA_NATS_USER" "value" .service) -}}
{{- end -}}
{{- $env | toJson -}}
{{- end }}

{{/* Mounts of the NATS credential and TLS files, as a JSON list. Takes root and service. */}}
{{- define "tessera.natsVolumeMounts" -}}
{{- $mounts := list -}}
{{- $root := .root -}}
{{- $file := include "tessera.natsAuthFile" . | fromJson -}}
{{- if $file.setting -}}
{{- $mounts = append $mounts (dict "name" "nats-auth" "mountPath" (include "tessera.natsAuthDir" $root) "readOnly" true) -}}
{{- end -}}
{{- if $root.Values.nats.tls.enabled -}}
{{- if include "tessera.natsCaSecret" $root -}}
{{- $mounts = append $mounts (dict "name" "nats-ca" "mountPath" (include "tessera.natsCaDir" $root) "readOnly" true) -}}
{{- end -}}
{{- if $root.Values.nats.tls.clientSecret -}}
{{- $mounts = append $mounts (dict "name" "nats-client-cert" "mountPath" (include "tessera.natsClientCertDir" $root) "readOnly" true) -}}
{{- end -}}
{{- end -}}
{{- $mounts | toJson -}}
{{- end }}

{{/*
Volumes of the NATS credential and TLS files. Key files are readable by the pod's group only
(defaultMode 288 = 0440, group = fsGroup), never world-readable; with per-service, a pod gets
its own service's password and no other. Takes root and service.
*/}}
{{- define "tessera.natsVolumes" -}}
{{- $volumes := list -}}
{{- $root := .root -}}
{{- $file := include "tessera.natsAuthFile" . | fromJson -}}
{{- if $file.setting -}}
{{- $secret := dict "secretName" (include "tessera.natsAuthSecret" $root) "defaultMode" 288 "items" (list (dict "key" $file.key "path" $file.key)) -}}
{{- $volumes = append $volumes (dict "name" "nats-auth" "secret" $secret) -}}
{{- end -}}
{{- if $root.Values.nats.tls.enabled -}}
{{- if include "tessera.natsCaSecret" $root -}}
{{- $key := $root.Values.nats.tls.caKey -}}
{{- $ca := dict "secretName" (include "tessera.natsCaSecret" $root) "defaultMode" 292 "items" (list (dict "key" $key "path" $key)) -}}
{{- $volumes = append $volumes (dict "name" "nats-ca" "secret" $ca) -}}
{{- end -}}
{{- if $root.Values.nats.tls.clientSecret -}}
{{- $items := list (dict "key" "tls.crt" "path" "tls.crt") (dict "key" "tls.key" "path" "tls.key") -}}
{{- $client := dict "secretName" $root.Values.nats.tls.clientSecret "defaultMode" 288 "items" $items -}}
{{- $volumes = append $volumes (dict "name" "nats-client-cert" "secret" $client) -}}
{{- end -}}
{{- end -}}
{{- $volumes | toJson -}}
{{- end }}

{{/*
The Secret with the CA the services trust: nats.tls.caSecret, else the embedded server's own
Secret; none (the image's trust store) for an external server without nats.tls.caSecret.
*/}}
{{- define "tessera.natsCaSecret" -}}
{{- if .Values.nats.tls.caSecret }}
{{- .Values.nats.tls.caSecret }}
{{- else if include "tessera.natsEmbedded" . }}
{{- .Values.nats.embedded.tls.secretName }}
{{- end }}
{{- end }}

{{/*
One Tessera container. Takes root, service (also the container's name and `tessera` subcommand),
args, extraArgs, env, ports, volumeMounts, resources and optionally securityContext. Liveness and
readiness are /healthz and /readyz on the port named http, which is --http-port.
*/}}
{{- define "tessera.container" -}}
{{- $root := .root -}}
{{- $httpPort := dict "name" "http" "containerPort" (int $root.Values.httpPort) "protocol" "TCP" -}}
{{- $nats := dict "root" $root "service" .service -}}
{{- $env := .env | default list -}}
{{- $mounts := list (dict "name" "tmp" "mountPath" "/tmp") -}}
{{- if not .noNats -}}
{{- $env = concat $env (include "tessera.natsEnv" $nats | fromJsonArray) -}}
{{- $mounts = concat $mounts (include "tessera.natsVolumeMounts" $nats | fromJsonArray) -}}
{{- end -}}
{{- $mounts = concat $mounts (.volumeMounts | default list) -}}
- name: {{ .service }}
  image: {{ include "tessera.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args:
    {{- include "tessera.args" . | fromJsonArray | toYaml | nindent 4 }}
  {{- with $env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- concat (list $httpPort) (.ports | default list) | toYaml | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: http
    initialDelaySeconds: 5
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 6
  readinessProbe:
    httpGet:
      path: /readyz
      port: http
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 3
  resources:
    {{- toYaml .resources | nindent 4 }}
  securityContext:
    {{- toYaml (.securityContext | default $root.Values.containerSecurityContext) | nindent 4 }}
  volumeMounts:
    {{- toYaml $mounts | nindent 4 }}
{{- end }}

{{/*
Pod-level settings of a Tessera pod. Takes root, component, values (the component's values:
nodeSelector, affinity, tolerations, priorityClassName, runtimeClassName), token (whether the
pod mounts its ServiceAccount token: only the binder's does), optionally securityContext,
placement (defaults for nodeSelector/affinity/tolerations) and volumes. Service links are off:
Kubernetes would otherwise inject <SERVICE>_PORT variables, and a Service whose name starts with
"tessera-" would produce TESSERA_* variables the services read as settings.
*/}}
{{- define "tessera.podSpec" -}}
{{- $root := .root -}}
{{- $v := .values -}}
{{- $placement := .placement | default dict -}}
serviceAccountName: {{ include "tessera.componentName" . }}
automountServiceAccountToken: {{ .token | default false }}
enableServiceLinks: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml (.securityContext | default $root.Values.podSecurityContext) | nindent 2 }}
{{- with ($v.nodeSelector | default $placement.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($v.affinity | default $placement.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($v.tolerations | default $placement.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  {{- $tmp := dict "name" "tmp" "emptyDir" (dict "medium" "Memory" "sizeLimit" "16Mi") }}
  {{- $nats := ternary list (include "tessera.natsVolumes" (dict "root" $root "service" .component) | fromJsonArray) (.noNats | default false) }}
  {{- concat (list $tmp) $nats (.volumes | default list) | toYaml | nindent 2 }}
{{- end }}

{{/* Spread replicas of a Deployment over nodes when it can (a preference, not a rule). */}}
{{- define "tessera.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "tessera.selectorLabels" . | nindent 12 }}
{{- end }}

{{/* Checks across values that the schema cannot express; each fails with what to change. */}}
{{- define "tessera.validate" -}}
{{- $auth := .Values.nats.auth }}
{{- $embedded := include "tessera.natsEmbedded" . }}
{{- if and (not $embedded) (eq $auth.type "per-service") (not $auth.existingSecret) }}
{{- fail "nats.auth.type=per-service with an external NATS (nats.url) needs nats.auth.existingSecret: a Secret with each service's password under its name (placer, binder, dashboard, inventory, deviceplugin, webhook), for the users you made on your server (`tessera nats-permissions` prints their permissions)" }}
{{- end }}
{{- if and $embedded (eq $auth.type "creds") }}
{{- fail "nats.auth.type=creds needs an external NATS server (set nats.url): the embedded server has no operator or account resolver" }}
{{- end }}
{{- if and $embedded (eq $auth.type "nkey") (not $auth.nkeyPublicKey) }}
{{- fail "nats.auth.type=nkey with the embedded NATS needs nats.auth.nkeyPublicKey (the U... public key of the seed)" }}
{{- end }}
{{- if and (ne $auth.type "none") (not $auth.existingSecret) }}
{{- if and (eq $auth.type "user-password") (or (not $auth.user) (not $auth.password)) }}
{{- fail "nats.auth.type=user-password: set nats.auth.existingSecret, or nats.auth.user and nats.auth.password for a chart-created Secret" }}
{{- end }}
{{- if and (eq $auth.type "token") (not $auth.token) }}
{{- fail "nats.auth.type=token: set nats.auth.existingSecret, or nats.auth.token for a chart-created Secret" }}
{{- end }}
{{- if and (eq $auth.type "nkey") (not $auth.nkeySeed) }}
{{- fail "nats.auth.type=nkey: set nats.auth.existingSecret, or nats.auth.nkeySeed for a chart-created Secret" }}
{{- end }}
{{- if and (eq $auth.type "creds") (not $auth.creds) }}
{{- fail "nats.auth.type=creds: set nats.auth.existingSecret, or nats.auth.creds for a chart-created Secret" }}
{{- end }}
{{- end }}
{{- if .Values.nats.tls.enabled }}
{{- if and $embedded (not .Values.nats.embedded.tls.secretName) }}
{{- fail "nats.tls.enabled with the embedded NATS needs nats.embedded.tls.secretName (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt for the server)" }}
{{- end }}
{{- end }}
{{- with .Values.binder }}
{{- if not (and (gt (float64 .leaseDurationS) (float64 .renewDeadlineS)) (gt (float64 .renewDeadlineS) (float64 .retryPeriodS))) }}
{{- fail (printf "binder: leader election needs leaseDurationS (%v) > renewDeadlineS (%v) > retryPeriodS (%v)" .leaseDurationS .renewDeadlineS .retryPeriodS) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
CEL of the webhooks' matchCondition: the pod asks for a tessera.dev/* resource in a container or
an init container (limits or requests). Other pods never reach the webhook.
*/}}
{{- define "tessera.writtenAnnotationsCondition" -}}
{{- $written := "has(o.metadata.annotations) && o.metadata.annotations.exists(k, k in ['tessera.dev/assignment', 'tessera.dev/bind-time', 'tessera.dev/assigned'])" -}}
{{ $written | replace "o." "object." }} || (oldObject != null && {{ $written | replace "o." "oldObject." }})
{{- end }}

{{- define "tessera.webhookCondition" -}}
{{- $asks := "c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('tessera.dev/'))) || (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('tessera.dev/'))))" -}}
object.spec.containers.exists({{ $asks }}) || (has(object.spec.initContainers) && object.spec.initContainers.exists({{ $asks }}))
{{- /* DRA mode: a pod with claims, whose class only the webhook can tell (its index of claims). */}}
{{- if eq .Values.gpuApi "dra" }} || has(object.spec.resourceClaims){{ end }}
{{- end }}
