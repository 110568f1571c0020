{{/*
Names and labels.
*/}}
{{- define "kgmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-kgmesh, or <release> when it already contains the chart name; at most 47
characters so that "<fullname>-deployment-id" still fits in 63. */}}
{{- define "kgmesh.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kgmesh.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kgmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kgmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kgmesh.labels" -}}
helm.sh/chart: {{ include "kgmesh.chart" . }}
{{ include "kgmesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kgmesh
{{- end }}

{{/* Selector labels of one service: (dict "root" $ "service" "auth"). */}}
{{- define "kgmesh.componentSelectorLabels" -}}
{{ include "kgmesh.selectorLabels" .root }}
app.kubernetes.io/component: {{ .service }}
{{- end }}

{{- define "kgmesh.componentLabels" -}}
{{ include "kgmesh.labels" .root }}
app.kubernetes.io/component: {{ .service }}
{{- end }}

{{- define "kgmesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kgmesh.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kgmesh.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The services: listen port, kind of probe, and what each one needs. The ports are the
defaults of `kgmesh serve` ([cluster] listen_addr stays unset).
  database/falkordb/nats: gets KGMESH_<STORE>_URL; vector: the Qdrant and embedding keys;
  llm: the LLM extractor's key; keys: auth's signing keys at secrets_dir; webhook: the
  webhook signing secret; blobs: rw or ro mount of the blob volume; metrics: serves
  [cluster] metrics_addr; hpa: whether an HPA is allowed.
*/}}
{{- define "kgmesh.services" -}}
auth:      {port: 7101, grpc: true,  readyWhen: kg.v1.Auth, database: true, keys: true, metrics: true, hpa: true}
files:     {port: 7102, grpc: true,  readyWhen: kg.v1.Files, database: true, nats: true, blobs: rw, metrics: true, hpa: true}
retrieval: {port: 7103, grpc: true,  falkordb: true, vector: true, metrics: true, hpa: true}
graph:     {port: 7104, grpc: true,  falkordb: true, nats: true, vector: true, metrics: true, hpa: true}
ontology:  {port: 7105, grpc: true,  database: true, nats: true, metrics: true, hpa: true}
approval:  {port: 7106, grpc: true,  database: true, webhook: true, metrics: true, hpa: true}
indexer:   {port: 7107, grpc: true,  falkordb: true, nats: true, vector: true, llm: true, blobs: ro, metrics: true, hpa: true}
gateway:   {port: 8080, grpc: false, metrics: false, hpa: true}
{{- end }}

{{/* The Kubernetes Service name of one kgmesh service: (dict "root" $ "service" "auth"). */}}
{{- define "kgmesh.serviceName" -}}
{{- printf "%s-%s" (include "kgmesh.fullname" .root) .service }}
{{- end }}

{{/* http://<fullname>-<service>:<port> (https:// with tls.enabled), as [cluster] *_addr. */}}
{{- define "kgmesh.serviceAddr" -}}
{{- $svc := get (fromYaml (include "kgmesh.services" .root)) .service }}
{{- printf "%s://%s:%v" (ternary "https" "http" (.root.Values.tls.enabled | default false)) (include "kgmesh.serviceName" .) $svc.port }}
{{- end }}

{{/* Every name a service is dialled by, for its TLS certificate. */}}
{{- define "kgmesh.tls.dnsNames" -}}
{{- $names := list }}
{{- range $service := list "auth" "files" "retrieval" "graph" "ontology" "approval" "indexer" }}
{{- $name := include "kgmesh.serviceName" (dict "root" $ "service" $service) }}
{{- $names = concat $names (list $name (printf "%s.%s" $name $.Release.Namespace) (printf "%s.%s.svc" $name $.Release.Namespace) (printf "%s.%s.svc.%s" $name $.Release.Namespace $.Values.clusterDomain)) }}
{{- end }}
{{- toYaml $names }}
{{- end }}

{{/* The Secret holding ca.crt, tls.crt and tls.key. */}}
{{- define "kgmesh.tls.secretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "kgmesh.fullname" .)) }}
{{- end }}

{{- define "kgmesh.tlsDir" -}}/etc/kgmesh/tls{{- end }}
{{- define "kgmesh.httpsDir" -}}/etc/kgmesh/https{{- end }}

{{- define "kgmesh.configPath" -}}/etc/kgmesh/kgmesh.toml{{- end }}
{{- define "kgmesh.secretsDir" -}}/etc/kgmesh/secrets{{- end }}
{{- define "kgmesh.blobDir" -}}/var/lib/kgmesh/blobs{{- end }}

{{/*
Environment variable names of the secrets. None starts with KGMESH_ (reserved for config).
*/}}
{{- define "kgmesh.env.webhook" -}}WEBHOOK_SIGNING_SECRET{{- end }}
{{- define "kgmesh.env.qdrantApiKey" -}}QDRANT_API_KEY{{- end }}
{{- define "kgmesh.env.embeddingApiKey" -}}EMBEDDING_API_KEY{{- end }}
{{- define "kgmesh.env.llmApiKey" -}}LLM_API_KEY{{- end }}
{{- define "kgmesh.env.warehouseUrl" -}}KGMESH_WAREHOUSE_URL{{- end }}

{{/*
One secret-backed value: (dict "root" $ "spec" .Values.database "key" "database-url").
Prints the Secret name and key as YAML ({name: ..., key: ...}), or nothing when neither
`url`/`value` nor `existingSecret` is set.
*/}}
{{- define "kgmesh.secretRef" -}}
{{- if .spec.existingSecret }}
name: {{ .spec.existingSecret }}
key: {{ .spec.existingSecretKey | default .key }}
{{- else if or .spec.url .spec.value }}
name: {{ include "kgmesh.fullname" .root }}-credentials
key: {{ .key }}
{{- end }}
{{- end }}

{{/*
The deployment id: .Values.deploymentId, else the one kept in the ConfigMap
<fullname>-deployment-id, else a new UUID. Computed once per render (cached in .Values) so
the config, its checksum and the kept ConfigMap all carry the same value.
*/}}
{{- define "kgmesh.deploymentId" -}}
{{- if .Values.deploymentId }}
{{- .Values.deploymentId }}
{{- else }}
{{- if not (hasKey .Values "__kgmeshGenerated") }}
{{- $_ := set .Values "__kgmeshGenerated" dict }}
{{- end }}
{{- $cache := get .Values "__kgmeshGenerated" }}
{{- if not (hasKey $cache "deploymentId") }}
{{- $id := "" }}
{{- $existing := lookup "v1" "ConfigMap" .Release.Namespace (printf "%s-deployment-id" (include "kgmesh.fullname" .)) }}
{{- if and $existing $existing.data }}
{{- $id = get $existing.data "deployment-id" }}
{{- end }}
{{- $_ := set $cache "deploymentId" ($id | default uuidv4) }}
{{- end }}
{{- get $cache "deploymentId" }}
{{- end }}
{{- end }}

{{/*
TOML writers. kgmesh.toml.value prints one value; kgmesh.toml.table prints a table's
scalar keys under its [header] (when it has any), then its sub-tables. Empty strings and
nulls are left out, so values.yaml can list a key without setting it.
*/}}
{{- define "kgmesh.toml.value" -}}
{{- if kindIs "string" . }}
{{- toJson . }}
{{- else if kindIs "bool" . }}
{{- ternary "true" "false" . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) (kindIs "float32" .) }}
{{- toJson . }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (include "kgmesh.toml.value" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- fail (printf "kgmesh.toml: cannot write %v (%s) as a TOML value" . (kindOf .)) }}
{{- end }}
{{- end }}

{{- define "kgmesh.toml.present" -}}
{{- if not (or (kindIs "invalid" .) (and (kindIs "string" .) (eq . ""))) }}yes{{ end }}
{{- end }}

{{/* (list "section.path" $map); "" for the top level. */}}
{{- define "kgmesh.toml.table" -}}
{{- $path := index . 0 }}
{{- $table := index . 1 }}
{{- $lines := list }}
{{- range $key, $value := $table }}
{{- if and (not (kindIs "map" $value)) (include "kgmesh.toml.present" $value) }}
{{- $lines = append $lines (printf "%s = %s" $key (include "kgmesh.toml.value" $value)) }}
{{- end }}
{{- end }}
{{- if and $path $lines }}

{{ printf "[%s]" $path }}
{{- end }}
{{- range $lines }}
{{ . }}
{{- end }}
{{- range $key, $value := $table }}
{{- if kindIs "map" $value }}
{{- include "kgmesh.toml.table" (list (ternary $key (printf "%s.%s" $path $key) (eq $path "")) $value) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Values the chart owns in kgmesh.toml: set elsewhere in the values, or computed.
*/}}
{{- define "kgmesh.validate" -}}
{{- $c := .Values.config | default dict }}
{{- $owned := dict
  "data_dir" "it is fixed by the chart (/tmp/kgmesh, scratch)"
  "http_addr" "the gateway listens on 0.0.0.0:8080"
  "http_tls" "set gateway.https.existingSecret (the chart mounts it and names the files)"
  "database_url" "set database.url or database.existingSecret (it reaches the pods from a Secret)"
  "falkordb_url" "set falkordb.url or falkordb.existingSecret"
  "nats_url" "set nats.url or nats.existingSecret"
  "cluster" "the chart writes [cluster] (service addresses, secrets_dir, blob_dir, deployment_id, metrics_addr, tls)" }}
{{- range $key, $why := $owned }}
{{- if hasKey $c $key }}
{{- fail (printf "config.%s must not be set: %s" $key $why) }}
{{- end }}
{{- end }}
{{- $nested := list
  (list "vector" "qdrant_url" "set qdrant.url")
  (list "vector" "api_key_env" "set qdrant.apiKey (the chart names the variable QDRANT_API_KEY)")
  (list "embedding" "api_key_env" "set apiKeys.embedding (the chart names the variable EMBEDDING_API_KEY)")
  (list "indexer" "concurrency" "set indexer.concurrency")
  (list "approval" "webhook_signing_secret_env" "set webhookSigningSecret (the chart names the variable WEBHOOK_SIGNING_SECRET)") }}
{{- range $nested }}
{{- $section := get $c (index . 0) }}
{{- if and (kindIs "map" $section) (hasKey $section (index . 1)) }}
{{- fail (printf "config.%s.%s must not be set: %s" (index . 0) (index . 1) (index . 2)) }}
{{- end }}
{{- end }}
{{- $indexer := get $c "indexer" }}
{{- if and (kindIs "map" $indexer) (kindIs "map" (get $indexer "llm")) (hasKey (get $indexer "llm") "api_key_env") }}
{{- fail "config.indexer.llm.api_key_env must not be set: set apiKeys.llm (the chart names the variable LLM_API_KEY)" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (not (and .Values.tls.certManager.issuerRef .Values.tls.certManager.issuerRef.name)) }}
{{- fail "tls.enabled needs the services' certificate: set tls.existingSecret (a Secret with ca.crt, tls.crt, tls.key) or tls.certManager.issuerRef.name (cert-manager issues it)" }}
{{- end }}
{{- $concurrency := int .Values.indexer.concurrency }}
{{- if or (lt $concurrency 1) (gt $concurrency 64) }}
{{- fail (printf "indexer.concurrency: expected 1..=64, got %d" $concurrency) }}
{{- end }}
{{- end }}

{{/*
The whole kgmesh.toml as a map: .Values.config plus the keys the chart owns.
*/}}
{{- define "kgmesh.configMap" -}}
{{- $root := . }}
{{- $c := deepCopy (.Values.config | default dict) }}
{{- $fullname := include "kgmesh.fullname" . }}
{{- $_ := set $c "data_dir" "/tmp/kgmesh" }}
{{- /* The gateway container always listens on 8080 (non-root); gateway.service.port maps to it. */}}
{{- $_ := set $c "http_addr" "0.0.0.0:8080" }}
{{- /* allowed_hosts: loopback, the gateway Service's names, the ingress hosts, then the user's. */}}
{{- $gw := include "kgmesh.serviceName" (dict "root" . "service" "gateway") }}
{{- $hosts := list "localhost" "127.0.0.1" "::1" $gw (printf "%s.%s" $gw .Release.Namespace) (printf "%s.%s.svc" $gw .Release.Namespace) (printf "%s.%s.svc.%s" $gw .Release.Namespace .Values.clusterDomain) }}
{{- if .Values.ingress.enabled }}
{{- range .Values.ingress.hosts }}{{ if .host }}{{ $hosts = append $hosts .host }}{{ end }}{{ end }}
{{- end }}
{{- $_ := set $c "allowed_hosts" (concat $hosts (get $c "allowed_hosts" | default list) | uniq) }}
{{- if and (not (get $c "public_base_url")) .Values.ingress.enabled .Values.ingress.hosts }}
{{- $first := (first .Values.ingress.hosts).host }}
{{- if $first }}
{{- $_ := set $c "public_base_url" (printf "%s://%s" (ternary "https" "http" (gt (len .Values.ingress.tls) 0)) $first) }}
{{- end }}
{{- end }}
{{- /* [vector] */}}
{{- $vector := get $c "vector" | default dict }}
{{- if .Values.qdrant.url }}{{ $_ := set $vector "qdrant_url" .Values.qdrant.url }}{{ end }}
{{- if include "kgmesh.secretRef" (dict "root" . "spec" .Values.qdrant.apiKey "key" "qdrant-api-key") }}
{{- $_ := set $vector "api_key_env" (include "kgmesh.env.qdrantApiKey" .) }}
{{- end }}
{{- $_ := set $c "vector" $vector }}
{{- /* [embedding] */}}
{{- $embedding := get $c "embedding" | default dict }}
{{- if include "kgmesh.secretRef" (dict "root" . "spec" .Values.apiKeys.embedding "key" "embedding-api-key") }}
{{- $_ := set $embedding "api_key_env" (include "kgmesh.env.embeddingApiKey" .) }}
{{- end }}
{{- $_ := set $c "embedding" $embedding }}
{{- /* [indexer], [indexer.llm] */}}
{{- $indexer := get $c "indexer" | default dict }}
{{- $_ := set $indexer "concurrency" (int .Values.indexer.concurrency) }}
{{- if include "kgmesh.secretRef" (dict "root" . "spec" .Values.apiKeys.llm "key" "llm-api-key") }}
{{- $llm := get $indexer "llm" | default dict }}
{{- $_ := set $llm "api_key_env" (include "kgmesh.env.llmApiKey" .) }}
{{- $_ := set $indexer "llm" $llm }}
{{- end }}
{{- $_ := set $c "indexer" $indexer }}
{{- /* [approval] */}}
{{- $approval := get $c "approval" | default dict }}
{{- $_ := set $approval "webhook_signing_secret_env" (include "kgmesh.env.webhook" .) }}
{{- $_ := set $c "approval" $approval }}
{{- /* [http_tls]: only the gateway mounts the Secret and checks the files. */}}
{{- if .Values.gateway.https.existingSecret }}
{{- $dir := include "kgmesh.httpsDir" . }}
{{- $_ := set $c "http_tls" (dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir)) }}
{{- end }}
{{- /* [cluster] */}}
{{- $cluster := dict
  "auth_addr" (include "kgmesh.serviceAddr" (dict "root" . "service" "auth"))
  "files_addr" (include "kgmesh.serviceAddr" (dict "root" . "service" "files"))
  "retrieval_addr" (include "kgmesh.serviceAddr" (dict "root" . "service" "retrieval"))
  "graph_addr" (include "kgmesh.serviceAddr" (dict "root" . "service" "graph"))
  "ontology_addr" (include "kgmesh.serviceAddr" (dict "root" . "service" "ontology"))
  "approval_addr" (include "kgmesh.serviceAddr" (dict "root" . "service" "approval"))
  "secrets_dir" (include "kgmesh.secretsDir" .)
  "blob_dir" (include "kgmesh.blobDir" .)
  "deployment_id" (include "kgmesh.deploymentId" .)
  "metrics_addr" (printf "0.0.0.0:%v" .Values.metrics.port) }}
{{- if .Values.tls.enabled }}
{{- $dir := include "kgmesh.tlsDir" . }}
{{- $_ := set $cluster "tls" (dict "ca_file" (printf "%s/ca.crt" $dir) "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir)) }}
{{- end }}
{{- $_ := set $c "cluster" $cluster }}
{{- toYaml $c }}
{{- end }}

{{/* kgmesh.toml as text. */}}
{{- define "kgmesh.toml" -}}
# Rendered by the kgmesh Helm chart (release {{ .Release.Name }}): do not edit; change the
# chart's values. Read by `kgmesh serve <service> --config {{ include "kgmesh.configPath" . }}`.
# Secrets are not here: KGMESH_DATABASE_URL, KGMESH_FALKORDB_URL, KGMESH_NATS_URL and the
# variables named by *_env come from Secrets as environment variables.
{{ include "kgmesh.toml.table" (list "" (fromYaml (include "kgmesh.configMap" .))) }}
{{- end }}

{{/* The environment of one service's container: (dict "root" $ "service" "auth" "svc" <entry of
kgmesh.services> "v" <the service's values>). Secret values only reach the services that use them. */}}
{{- define "kgmesh.env" -}}
{{- $root := .root }}
{{- $service := .service }}
{{- $svc := .svc }}
{{- $v := .v }}
{{- $fullname := include "kgmesh.fullname" $root }}
{{- if $svc.database }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $root.Values.database "key" "database-url") }}
{{- if $ref }}
- name: KGMESH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- if $svc.falkordb }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $root.Values.falkordb "key" "falkordb-url") }}
{{- if $ref }}
- name: KGMESH_FALKORDB_URL
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- if $svc.nats }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $root.Values.nats "key" "nats-url") }}
{{- if $ref }}
- name: KGMESH_NATS_URL
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- if $svc.vector }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $root.Values.qdrant.apiKey "key" "qdrant-api-key") }}
{{- if $ref }}
- name: {{ include "kgmesh.env.qdrantApiKey" $root }}
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $root.Values.apiKeys.embedding "key" "embedding-api-key") }}
{{- if $ref }}
- name: {{ include "kgmesh.env.embeddingApiKey" $root }}
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- if $svc.llm }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $root.Values.apiKeys.llm "key" "llm-api-key") }}
{{- if $ref }}
- name: {{ include "kgmesh.env.llmApiKey" $root }}
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- if eq $service "ontology" }}
{{- $ref := include "kgmesh.secretRef" (dict "root" $root "spec" $v.warehouseUrl "key" "warehouse-url") }}
{{- if $ref }}
- name: {{ include "kgmesh.env.warehouseUrl" $root }}
  valueFrom:
    secretKeyRef:
      {{- $ref | trim | nindent 6 }}
{{- end }}
{{- end }}
{{- if $svc.webhook }}
- name: {{ include "kgmesh.env.webhook" $root }}
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.webhookSigningSecret.existingSecret | default (printf "%s-webhook" $fullname) }}
      key: {{ $root.Values.webhookSigningSecret.existingSecretKey | default "webhook-signing-secret" }}
{{- end }}
{{- if $svc.vector }}
{{- $res := $v.resources | default dict }}
{{- $field := "" }}
{{- if and $res.limits $res.limits.cpu }}{{ $field = "limits.cpu" }}{{ else if and $res.requests $res.requests.cpu }}{{ $field = "requests.cpu" }}{{ end }}
{{- if $field }}
# Threads of the embedding model's matrix products: the pod's CPU, not the node's
# cores (rounded up to whole CPUs).
- name: RAYON_NUM_THREADS
  valueFrom:
    resourceFieldRef:
      containerName: {{ $service }}
      resource: {{ $field }}
      divisor: "1"
{{- end }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- with $v.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
