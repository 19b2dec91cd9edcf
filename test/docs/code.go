package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// shippedGoFiles parses every non-test Go file of the shipped code: the
// module but test/, hack/ and bin/.
func shippedGoFiles(root string) ([]*ast.File, error) {
	var files []*ast.File
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch {
			case rel == "test", rel == "hack", rel == "bin", strings.HasPrefix(d.Name(), "."):
				if rel != "." {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	})
	return files, err
}

// stringConsts maps the names of a file's string constants and of its
// variables assigned a string literal (ns := "galactic_gc") to the value.
func stringConsts(f *ast.File) map[string]string {
	vals := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			for i, name := range n.Names {
				if i < len(n.Values) {
					if s, ok := stringLit(n.Values[i]); ok {
						vals[name.Name] = s
					}
				}
			}
		case *ast.AssignStmt:
			for i, lhs := range n.Lhs {
				id, ok := lhs.(*ast.Ident)
				if ok && i < len(n.Rhs) {
					if s, ok := stringLit(n.Rhs[i]); ok {
						vals[id.Name] = s
					}
				}
			}
		}
		return true
	})
	return vals
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// MetricNames are the Prometheus metrics the shipped code registers: the
// Namespace, Subsystem and Name of every prometheus.*Opts literal and the
// name of every prometheus.NewDesc.
func MetricNames(root string) ([]string, error) {
	files, err := shippedGoFiles(root)
	if err != nil {
		return nil, err
	}
	// A metric's name may use a constant of another file of its package;
	// packages are told apart by name, which is enough for metric names.
	pkgVals := map[string]map[string]string{}
	for _, f := range files {
		if pkgVals[f.Name.Name] == nil {
			pkgVals[f.Name.Name] = map[string]string{}
		}
		maps.Copy(pkgVals[f.Name.Name], stringConsts(f))
	}
	set := map[string]bool{}
	for _, f := range files {
		vals := maps.Clone(pkgVals[f.Name.Name])
		maps.Copy(vals, stringConsts(f))
		var value func(e ast.Expr) string
		value = func(e ast.Expr) string {
			if s, ok := stringLit(e); ok {
				return s
			}
			if id, ok := e.(*ast.Ident); ok {
				return vals[id.Name]
			}
			// A name put together from constants: namespace + "_name".
			if b, ok := e.(*ast.BinaryExpr); ok && b.Op == token.ADD {
				l, r := value(b.X), value(b.Y)
				if l != "" && r != "" {
					return l + r
				}
			}
			return ""
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok || !isPkg(sel.X, "prometheus") || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				parts := map[string]string{}
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok {
							parts[k.Name] = value(kv.Value)
						}
					}
				}
				if parts["Name"] == "" {
					return true
				}
				var name []string
				for _, k := range []string{"Namespace", "Subsystem", "Name"} {
					if parts[k] != "" {
						name = append(name, parts[k])
					}
				}
				set[strings.Join(name, "_")] = true
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if ok && isPkg(sel.X, "prometheus") && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					if s := value(n.Args[0]); s != "" {
						set[s] = true
					}
				}
			}
			return true
		})
	}
	return sortedSet(set), nil
}

func isPkg(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// ConditionNames are the values of the shipped code's string constants
// named Condition… or Reason…: the condition types and reasons it writes.
func ConditionNames(root string) (map[string]string, error) {
	files, err := shippedGoFiles(root)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range files {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) || !(strings.HasPrefix(name.Name, "Condition") || strings.HasPrefix(name.Name, "Reason")) {
						continue
					}
					if s, ok := stringLit(vs.Values[i]); ok {
						out[name.Name] = s
					}
				}
			}
		}
	}
	return out, nil
}

func sortedSet(set map[string]bool) []string {
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
