{{/* The release's full name, cut to 63 characters (a DNS label). */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "jobmanager"). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sluice.pipelineConfigMap" -}}
{{- default (printf "%s-pipeline" (include "sluice.fullname" .)) .Values.pipeline.existingConfigMap -}}
{{- end -}}

{{- define "sluice.s3Secret" -}}
{{- if .Values.s3.existingSecret -}}
{{- .Values.s3.existingSecret -}}
{{- else if .Values.s3.accessKeyId -}}
{{- printf "%s-s3" (include "sluice.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* high-availability.etcd.endpoints: the given ones, else the chart's etcd members. */}}
{{- define "sluice.etcdEndpoints" -}}
{{- if .Values.highAvailability.etcdEndpoints -}}
{{- .Values.highAvailability.etcdEndpoints -}}
{{- else if .Values.etcd.enabled -}}
{{- $fullname := include "sluice.fullname" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $members = append $members (printf "http://%s-etcd-%d.%s-etcd.%s.svc:2379" $fullname $i $fullname $.Release.Namespace) -}}
{{- end -}}
{{- join "," $members -}}
{{- else -}}
{{- fail "highAvailability.enabled needs highAvailability.etcdEndpoints (an existing etcd) or etcd.enabled=true (the chart's own)" -}}
{{- end -}}
{{- end -}}

{{/* The -D options every process gets (the same for all: the job graph and engine options must match). */}}
{{- define "sluice.commonOptions" -}}
{{- $opts := list -}}
{{- with .Values.checkpoints.dir }}{{ $opts = append $opts (printf "execution.checkpointing.dir=%s" .) }}{{ end -}}
{{- with .Values.checkpoints.savepointDir }}{{ $opts = append $opts (printf "execution.checkpointing.savepoint-dir=%s" .) }}{{ end -}}
{{- with .Values.s3.endpoint }}{{ $opts = append $opts (printf "s3.endpoint=%s" .) }}{{ end -}}
{{- if .Values.s3.pathStyleAccess }}{{ $opts = append $opts "s3.path-style-access=true" }}{{ end -}}
{{- with .Values.s3.region }}{{ $opts = append $opts (printf "s3.region=%s" .) }}{{ end -}}
{{- if .Values.highAvailability.enabled -}}
{{- $opts = append $opts "high-availability.type=etcd" -}}
{{- $opts = append $opts (printf "high-availability.etcd.endpoints=%s" (include "sluice.etcdEndpoints" .)) -}}
{{- $opts = append $opts (printf "high-availability.cluster-id=%s" (default (include "sluice.fullname" .) .Values.highAvailability.clusterId)) -}}
{{- $opts = append $opts (printf "high-availability.etcd.lease-ttl=%s" .Values.highAvailability.leaseTtl) -}}
{{- end -}}
{{- range $k, $v := .Values.config }}{{ $opts = append $opts (printf "%s=%v" $k $v) }}{{ end -}}
{{- range $opts }}
- "-D"
- {{ . | quote }}
{{- end -}}
{{- end -}}

{{/* Environment of every pod: the pod's IP, S3 credentials, the chart's secret and the user's. */}}
{{- define "sluice.env" -}}
- name: POD_IP
  valueFrom:
    fieldRef: { fieldPath: status.podIP }
{{- with include "sluice.s3Secret" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: { name: {{ . }}, key: AWS_ACCESS_KEY_ID }
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: { name: {{ . }}, key: AWS_SECRET_ACCESS_KEY }
{{- end }}
{{- end -}}

{{- define "sluice.envFrom" -}}
{{- if .Values.secrets.env }}
- secretRef: { name: {{ include "sluice.fullname" . }}-env }
{{- end }}
{{- range .Values.secrets.existingSecrets }}
- secretRef: { name: {{ . }} }
{{- end }}
{{- end -}}

{{/* A checksum of what every pod reads at start: a change rolls the pods. */}}
{{- define "sluice.configChecksum" -}}
{{- printf "%s|%s|%s" .Values.pipeline.file (toJson .Values.secrets.env) (toJson .Values.config) | sha256sum -}}
{{- end -}}

{{/* jobmanager.rpc.address, where the RPC service binds: with high availability the pod's IP, which the leader
publishes in etcd for TaskManagers; without, every interface (the Service reaches it). The REST API binds to every
interface in both cases (rest.address=0.0.0.0), so kubectl port-forward reaches it. */}}
{{- define "sluice.jobmanagerAddress" -}}
{{- if .Values.highAvailability.enabled -}}
jobmanager.rpc.address=$(POD_IP)
{{- else -}}
jobmanager.rpc.address=0.0.0.0
{{- end -}}
{{- end -}}
