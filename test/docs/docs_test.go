package docs

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/reference/cli.md from the binaries (make docs)")

// repoRoot is the checkout this package was compiled from.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// allPages reads README.md and every page under docs/.
func allPages(t *testing.T) map[string]*Page {
	t.Helper()
	root := repoRoot()
	rels, err := DocPages(root)
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]*Page{}
	for _, rel := range append(rels, "README.md") {
		p, err := ReadPage(root, rel)
		if err != nil {
			t.Fatal(err)
		}
		pages[rel] = p
	}
	return pages
}

func TestEveryRelativeLinkResolves(t *testing.T) {
	root := repoRoot()
	pages := allPages(t)
	for _, rel := range sortedKeys(pages) {
		p := pages[rel]
		for _, l := range p.Links {
			if External(l.Target) {
				continue
			}
			path, frag := Resolve(rel, l.Target)
			if _, err := os.Stat(filepath.Join(root, path)); err != nil {
				t.Errorf("%s:%d: link %q: %s does not exist", rel, l.Line, l.Target, path)
				continue
			}
			if frag == "" {
				continue
			}
			target, ok := pages[path]
			if !ok {
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s:%d: link %q has an anchor into %s, which is not a page", rel, l.Line, l.Target, path)
				}
				continue
			}
			if !target.Anchors[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading or anchor %q", rel, l.Line, l.Target, path, frag)
			}
		}
	}
}

func TestTheMapReachesEveryPageAndEachPageItsNeighbours(t *testing.T) {
	pages := allPages(t)
	const mapPath = "docs/README.md"
	sections := MapSections(pages[mapPath])
	onMap := map[string]bool{}
	for _, s := range sections {
		for _, p := range s.Pages {
			onMap[p] = true
		}
	}
	for _, rel := range sortedKeys(pages) {
		if strings.HasPrefix(rel, "docs/") && rel != mapPath && !onMap[rel] {
			t.Errorf("%s is not on the map (%s)", rel, mapPath)
		}
	}
	links := func(p *Page) map[string]bool {
		out := map[string]bool{}
		for _, l := range p.Links {
			if !External(l.Target) {
				path, _ := Resolve(p.Path, l.Target)
				out[path] = true
			}
		}
		return out
	}
	for _, s := range sections {
		for i, rel := range s.Pages {
			p, ok := pages[rel]
			if !ok {
				continue // the link check reports it
			}
			to := links(p)
			if !to[mapPath] {
				t.Errorf("%s does not link the map (%s)", rel, mapPath)
			}
			if i > 0 && !to[s.Pages[i-1]] {
				t.Errorf("%s does not link %s, before it in the map's section %q", rel, s.Pages[i-1], s.Title)
			}
			if i+1 < len(s.Pages) && !to[s.Pages[i+1]] {
				t.Errorf("%s does not link %s, after it in the map's section %q", rel, s.Pages[i+1], s.Title)
			}
		}
	}
}

func TestTheCLIReferenceIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	root := repoRoot()
	want, err := CLIReference(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "docs", "reference", "cli.md")
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("docs/reference/cli.md is not what the binaries print: run `make docs` and commit it\n%s", firstDiff(string(got), want))
	}
}

// firstDiff shows where two texts first differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + itoa(i+1) + ":\n  committed: " + gl + "\n  generated: " + wl
		}
	}
	return ""
}

var metricRE = regexp.MustCompile(`\bgalactic_[a-z0-9_]+`)

func TestEveryMetricIsInTheReference(t *testing.T) {
	root := repoRoot()
	names, err := MetricNames(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("found no metric registration in the code")
	}
	ref, err := os.ReadFile(filepath.Join(root, "docs", "reference", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range metricRE.FindAllString(string(ref), -1) {
		documented[m] = true
	}
	for _, n := range names {
		if !documented[n] {
			t.Errorf("metric %s is registered in the code but not in docs/reference/metrics.md", n)
		}
	}
	for _, n := range sortedKeys(documented) {
		if !slices.Contains(names, n) {
			t.Errorf("docs/reference/metrics.md lists %s, which no code registers", n)
		}
	}
}

func TestEveryConditionIsInTheReference(t *testing.T) {
	root := repoRoot()
	consts, err := ConditionNames(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(consts) == 0 {
		t.Fatal("found no Condition or Reason constant in the code")
	}
	ref, err := os.ReadFile(filepath.Join(root, "docs", "reference", "resources.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(consts) {
		if !strings.Contains(string(ref), "`"+consts[name]+"`") {
			t.Errorf("%s (%q) is not in docs/reference/resources.md", name, consts[name])
		}
	}
}

// historyRE is what a run history, a tracker's wording or the design
// brief (not in the repository) reads like.
var historyRE = regexp.MustCompile(`(?i)this stop|whole run|wave|must-show|stop [0-9]|on a later day|DESIGN\.md`)

func TestNoPageTellsARunHistory(t *testing.T) {
	for rel, p := range allPages(t) {
		re := historyRE
		if rel == "docs/benchmarks.md" {
			// The report tells of its own run, not of earlier ones.
			re = regexp.MustCompile(`DESIGN\.md|must-show`)
		}
		for i, line := range strings.Split(p.Text, "\n") {
			if m := re.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: pages say what is true now; history goes into commit messages", rel, i+1, m)
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestTheREADMELayoutNamesEveryDirectory(t *testing.T) {
	root := repoRoot()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	layout, _, _ = strings.Cut(layout, "\n## ")
	named := map[string]bool{}
	for _, line := range strings.Split(layout, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	var want []string
	tops, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range tops {
		if d.IsDir() && !strings.HasPrefix(d.Name(), ".") && d.Name() != "bin" {
			want = append(want, d.Name())
		}
	}
	for _, dir := range []string{"pkg", "plugins"} {
		subs, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range subs {
			if d.IsDir() {
				want = append(want, dir+"/"+d.Name())
			}
		}
	}
	for _, w := range want {
		found := named[w]
		for n := range named {
			found = found || strings.HasPrefix(n, w+"/")
		}
		if !found {
			t.Errorf("README.md's layout table does not name %s/", w)
		}
	}
}
