// Package docs keeps the user documentation true to the code: its links
// resolve, its map reaches every page, its CLI reference is what the
// binaries print, and its metrics and conditions are the ones the code
// registers. cli.go generates docs/reference/cli.md; `make docs` rewrites
// it.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// Page is one Markdown file with what the checks need of it.
type Page struct {
	// Path is the file's path relative to the repository root.
	Path string
	// Text is the file's content.
	Text string
	// Links are the link targets outside code, in order.
	Links []Link
	// Anchors are the fragment names the page defines: its headings'
	// slugs and its explicit <a id> names.
	Anchors map[string]bool
	// Headings are the page's headings in order, with their levels.
	Headings []Heading
}

// Link is one [text](target) of a page.
type Link struct {
	Text, Target string
	Line         int
}

// Heading is one ATX heading.
type Heading struct {
	Level int
	Text  string
}

var (
	linkRE    = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	anchorRE  = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeRE    = regexp.MustCompile("`[^`]*`")
)

// ReadPage reads and parses root/rel.
func ReadPage(root, rel string) (*Page, error) {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		return nil, err
	}
	return ParsePage(rel, string(b)), nil
}

// ParsePage parses Markdown text: links and headings outside fenced code
// blocks, links outside inline code spans.
func ParsePage(rel, text string) *Page {
	p := &Page{Path: rel, Text: text, Anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range anchorRE.FindAllStringSubmatch(line, -1) {
			p.Anchors[m[1]] = true
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			h := Heading{Level: len(m[1]), Text: m[2]}
			p.Headings = append(p.Headings, h)
			slug := Slug(h.Text)
			if n := seen[slug]; n > 0 {
				p.Anchors[slug+"-"+itoa(n)] = true
			} else {
				p.Anchors[slug] = true
			}
			seen[slug]++
		}
		plain := codeRE.ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(plain, -1) {
			p.Links = append(p.Links, Link{Text: m[1], Target: m[2], Line: i + 1})
		}
	}
	return p
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}

// Slug is the fragment GitHub gives a heading: lower case, punctuation
// other than '-' and '_' dropped, each space a '-'.
func Slug(heading string) string {
	// Links inside a heading count by their text.
	heading = linkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// External reports whether a link target leaves the repository.
func External(target string) bool {
	return strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:")
}

// Resolve splits a relative link target of page into the repository path
// it names and its fragment; a target of only "#frag" names the page
// itself.
func Resolve(page, target string) (path, frag string) {
	path, frag, _ = strings.Cut(target, "#")
	if path == "" {
		return page, frag
	}
	return filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), path))), frag
}

// DocPages lists every Markdown file under root/docs, relative to root,
// sorted.
func DocPages(root string) ([]string, error) {
	var pages []string
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	sort.Strings(pages)
	return pages, err
}

// Section is one "## " section of the map with the pages it links, in
// order.
type Section struct {
	Title string
	Pages []string
}

// MapSections reads the map's sections: each level-2 heading and the
// pages linked under it.
func MapSections(m *Page) []Section {
	var out []Section
	lines := strings.Split(m.Text, "\n")
	for _, l := range m.Links {
		title := ""
		for i := l.Line - 1; i >= 0; i-- {
			if strings.HasPrefix(lines[i], "## ") {
				title = strings.TrimPrefix(lines[i], "## ")
				break
			}
		}
		if title == "" || External(l.Target) {
			continue
		}
		path, _ := Resolve(m.Path, l.Target)
		if len(out) == 0 || out[len(out)-1].Title != title {
			out = append(out, Section{Title: title})
		}
		s := &out[len(out)-1]
		if len(s.Pages) == 0 || s.Pages[len(s.Pages)-1] != path {
			s.Pages = append(s.Pages, path)
		}
	}
	return out
}
