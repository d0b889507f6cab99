package cmd

import (
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

// flowrun version prints what make build stamps with -ldflags -X.
func TestVersionPrintsTheStampedVersionAndCommit(t *testing.T) {
	defer func(v, c string) { Version, Commit = v, c }(Version, Commit)
	Version, Commit = "v0.1.0-3-g1a2b3c4-dirty", "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
	code, out, errOut := run(t, "version")
	if code != ExitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if lines[0] != "flowrun v0.1.0-3-g1a2b3c4-dirty" || !strings.HasPrefix(lines[1], "commit: 1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b") {
		t.Fatalf("flowrun version printed:\n%s", out)
	}
}

// Without -ldflags, the version and commit come from what the go command recorded.
func TestVersionOfFallsBackToTheBuildInfo(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}
	for name, tc := range map[string]struct {
		version, commit string
		info            *debug.BuildInfo
		want            versionInfo
	}{
		"stamped": {"v0.1.0", "feed", &debug.BuildInfo{GoVersion: "go1.25.1", Main: debug.Module{Path: flowrunModule, Version: "v0.0.9"}, Settings: vcs},
			versionInfo{Version: "v0.1.0", Commit: "feed", Modified: true, GoVersion: "go1.25.1"}},
		"go build in a checkout": {"", "", &debug.BuildInfo{Main: debug.Module{Path: flowrunModule, Version: "v0.1.1-0.20261206040000-abc123+dirty"}, Settings: vcs},
			versionInfo{Version: "v0.1.1-0.20261206040000-abc123+dirty", Commit: "abc123", Modified: true}},
		"go install module@version": {"", "", &debug.BuildInfo{Main: debug.Module{Path: flowrunModule, Version: "v0.1.0"}},
			versionInfo{Version: "v0.1.0", Commit: "unknown"}},
		"flowrun build": {"", "", &debug.BuildInfo{Main: debug.Module{Path: "flowrun-custom", Version: "(devel)"}, Deps: []*debug.Module{{Path: flowrunModule, Version: "v0.1.0"}}},
			versionInfo{Version: "v0.1.0", Commit: "unknown"}},
		"no vcs, devel": {"", "", &debug.BuildInfo{Main: debug.Module{Path: flowrunModule, Version: "(devel)"}},
			versionInfo{Version: "dev", Commit: "unknown"}},
		"no build info": {"", "", nil, versionInfo{Version: "dev", Commit: "unknown"}},
	} {
		if got := versionOf(tc.version, tc.commit, tc.info); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", name, got, tc.want)
		}
	}
}

// make build stamps the binary with the same -ldflags as flowrun build (whose test runs the binary
// it makes): the Makefile's rule, printed by make -n, carries them.
func TestMakeBuildStampsTheVersion(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make command")
	}
	const version, commit = "v9.8.7-test", "0123456789abcdef0123456789abcdef01234567"
	out, err := exec.Command(makeBin, "-s", "-n", "-C", "..", "build", "VERSION="+version, "COMMIT="+commit).CombinedOutput()
	want := `-ldflags "` + versionLDFlags(versionInfo{Version: version, Commit: commit}) + `"`
	if err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("make -n build: %v, want %s in:\n%s", err, want, out)
	}
}
