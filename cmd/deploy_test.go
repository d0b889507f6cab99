package cmd

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
)

// The files of deploy/ (docs/deploy.md) are held to what this flowrun does: a manifest or unit
// that names a flag, an environment variable or an endpoint that flowrun does not have fails here,
// and so does a pipeline that does not validate.

// manifest is the part of a Kubernetes object that deploy/kubernetes uses. It is decoded with
// KnownFields, so that a misspelt field (readinessProbe.httpGet.paht) is an error, not a field
// Kubernetes would silently drop.
type manifest struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   objectMeta        `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	Spec       *deploymentSpec   `yaml:"spec"`
}

type objectMeta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type deploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Strategy struct {
		Type          string `yaml:"type"`
		RollingUpdate struct {
			MaxSurge       int `yaml:"maxSurge"`
			MaxUnavailable int `yaml:"maxUnavailable"`
		} `yaml:"rollingUpdate"`
	} `yaml:"strategy"`
	Template struct {
		Metadata objectMeta `yaml:"metadata"`
		Spec     podSpec    `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot   bool `yaml:"runAsNonRoot"`
		RunAsUser      int  `yaml:"runAsUser"`
		RunAsGroup     int  `yaml:"runAsGroup"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	TopologySpreadConstraints []struct {
		MaxSkew           int    `yaml:"maxSkew"`
		TopologyKey       string `yaml:"topologyKey"`
		WhenUnsatisfiable string `yaml:"whenUnsatisfiable"`
		LabelSelector     struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"labelSelector"`
	} `yaml:"topologySpreadConstraints"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom struct {
			SecretKeyRef struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			ResourceFieldRef struct {
				Resource string `yaml:"resource"`
			} `yaml:"resourceFieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  probe `yaml:"livenessProbe"`
	ReadinessProbe probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

func TestKubernetesManifest(t *testing.T) {
	f, err := os.Open("../deploy/kubernetes/flowrun.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	objects := map[string]manifest{}
	for {
		var m manifest
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/kubernetes/flowrun.yaml: %v", err)
		}
		objects[m.Kind] = m
	}
	cm, d := objects["ConfigMap"], objects["Deployment"]
	if cm.APIVersion != "v1" || d.APIVersion != "apps/v1" || d.Spec == nil || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want a v1 ConfigMap and an apps/v1 Deployment of one container, got %+v", objects)
	}
	spec, c := d.Spec, d.Spec.Template.Spec.Containers[0]
	if spec.Replicas < 2 || spec.Selector.MatchLabels["app.kubernetes.io/name"] != spec.Template.Metadata.Labels["app.kubernetes.io/name"] {
		t.Errorf("replicas %d, selector %v, pod labels %v", spec.Replicas, spec.Selector.MatchLabels, spec.Template.Metadata.Labels)
	}
	if sc := spec.Template.Spec.SecurityContext; !sc.RunAsNonRoot || sc.RunAsUser == 0 {
		t.Errorf("the pod may run as root: %+v", sc)
	}

	// The arguments are flowrun run's: the pipeline where the ConfigMap is mounted, --http on
	// every interface at the container's port.
	run := newRunCommand(IO{})
	if err := run.ParseFlags(c.Args[1:]); err != nil || c.Args[0] != "run" || len(run.Flags().Args()) != 1 {
		t.Fatalf("args %q are not flowrun run PATH [flags]: %v", c.Args, err)
	}
	pipelineDir := run.Flags().Args()[0]
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Template.Spec.Volumes {
			mounted = mounted || m.Name == v.Name && v.ConfigMap.Name == cm.Metadata.Name && m.MountPath == pipelineDir
		}
	}
	if !mounted {
		t.Errorf("the pipeline path %s is not where the ConfigMap %s is mounted", pipelineDir, cm.Metadata.Name)
	}
	host, port, err := net.SplitHostPort(run.Flags().Lookup("http").Value.String())
	if err != nil || host != "0.0.0.0" {
		t.Errorf("--http %q: the probes need it on 0.0.0.0 (%v)", run.Flags().Lookup("http").Value, err)
	}
	ports := map[string]string{}
	for _, p := range c.Ports {
		ports[p.Name] = strconv.Itoa(p.ContainerPort)
	}
	for name, p := range map[string]probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if ports[p.HTTPGet.Port] != port {
			t.Errorf("the %s probe's port %q is not --http's %s", name, p.HTTPGet.Port, port)
		}
	}
	if d.Spec.Template.Metadata.Annotations["prometheus.io/port"] != port {
		t.Errorf("prometheus.io/port %q is not --http's %s", d.Spec.Template.Metadata.Annotations["prometheus.io/port"], port)
	}
	redisFromSecret := false
	for _, e := range c.Env {
		redisFromSecret = redisFromSecret || e.Name == EnvRedisURL && e.ValueFrom.SecretKeyRef.Name != "" && e.ValueFrom.SecretKeyRef.Key != ""
	}
	if !redisFromSecret {
		t.Errorf("%s does not come from a Secret", EnvRedisURL)
	}

	// The ConfigMap's pipeline is valid, as the mounted directory (its files) holds it.
	dir := t.TempDir()
	for name, text := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	plan, _, diags := flow.Build(dir, flow.Options{})
	if diags.HasErrors() {
		t.Fatalf("the ConfigMap's pipeline: %v", diags)
	}

	// The probes' paths are the endpoints of flowrun run --http: liveness answers while the
	// process serves, readiness only once the pipeline is ready.
	for _, tc := range []struct {
		path  string
		ready error
		want  int
	}{
		{c.LivenessProbe.HTTPGet.Path, errors.New("not ready"), http.StatusOK},
		{c.ReadinessProbe.HTTPGet.Path, nil, http.StatusOK},
		{c.ReadinessProbe.HTTPGet.Path, errors.New("not ready"), http.StatusServiceUnavailable},
	} {
		rec := httptest.NewRecorder()
		web.NewHandler(probed{plan, tc.ready}, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.want || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
			t.Errorf("GET %s with Ready() = %v: %d %s, want %d", tc.path, tc.ready, rec.Code, rec.Header().Get("Content-Type"), tc.want)
		}
	}
}

// probed is a pipeline whose readiness a test sets.
type probed struct {
	plan  *flow.Plan
	ready error
}

func (p probed) Plan() *flow.Plan           { return p.plan }
func (p probed) Snapshot() runtime.Snapshot { return runtime.Snapshot{} }
func (p probed) Ready() error               { return p.ready }

func TestSystemdUnit(t *testing.T) {
	unit := readUnit(t, "../deploy/systemd/flowrun@.service")
	env := readEnvFile(t, "../deploy/systemd/flowrun.env")
	service := unit["Service"]
	if user := service["User"]; user == "" || user == "root" {
		t.Errorf("User=%q: run it as a user of its own", user)
	}
	if service["Restart"] != "on-failure" || service["EnvironmentFile"] == "" || service["RestartPreventExitStatus"] != strconv.Itoa(ExitInvalid) {
		t.Errorf("Restart=%q EnvironmentFile=%q RestartPreventExitStatus=%q", service["Restart"], service["EnvironmentFile"], service["RestartPreventExitStatus"])
	}
	// ExecStart with $FLOWRUN_ARGS split on white space, as systemd does.
	var args []string
	for _, a := range strings.Fields(service["ExecStart"]) {
		if a == "$FLOWRUN_ARGS" {
			args = append(args, strings.Fields(env["FLOWRUN_ARGS"])...)
		} else {
			args = append(args, a)
		}
	}
	run := newRunCommand(IO{})
	if len(args) < 3 || filepath.Base(args[0]) != "flowrun" || args[1] != "run" {
		t.Fatalf("ExecStart=%s is not flowrun run", service["ExecStart"])
	}
	if err := run.ParseFlags(args[2:]); err != nil || len(run.Flags().Args()) != 1 {
		t.Fatalf("ExecStart's arguments %q: %v", args[2:], err)
	}
	if _, _, err := net.SplitHostPort(run.Flags().Lookup("http").Value.String()); err != nil {
		t.Errorf("--http: %v", err)
	}
}

// Every variable of the example environment file, set or commented out, is one that flowrun reads.
func TestSystemdEnvironmentFileNamesWhatFlowrunReads(t *testing.T) {
	env := readEnvFile(t, "../deploy/systemd/flowrun.env")
	if env[EnvRedisURL] == "" {
		t.Errorf("the environment file sets no %s: flowrun would run on an in-memory Redis", EnvRedisURL)
	}
	for name := range env {
		switch {
		case name == EnvRedisURL || name == EnvRedisCA || name == EnvRedisCert || name == EnvRedisKey:
		case name == "FLOWRUN_ARGS": // the unit's, for ExecStart
		case strings.HasPrefix(name, "FLOWRUN_VAR_"), strings.HasPrefix(name, "OTEL_"):
		default:
			t.Errorf("flowrun reads no %s", name)
		}
	}
}

// readUnit reads a systemd unit file into its sections' settings.
func readUnit(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sections, section := map[string]map[string]string{}, ""
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			sections[section] = map[string]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: %q is not a setting of a section", path, line)
			}
			sections[section][k] = v
		}
	}
	return sections
}

var envName = regexp.MustCompile(`^[A-Z][A-Za-z0-9_]*$`)

// readEnvFile reads the NAME=value lines of an environment file, those commented out (#NAME=value)
// included.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(text), "\n") {
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "#"), "=")
		if ok && envName.MatchString(name) {
			env[name] = value
		}
	}
	return env
}
