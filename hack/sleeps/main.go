// Command sleeps adds up the fixed time.Sleep calls of the Go files under
// a directory and fails when they exceed a bound (`make lint` runs it on
// test/integration). Tests wait on observed state; a fixed sleep is only
// for a window in which something must not happen, and that window is a
// short timer of the test's config.
//
//	sleeps [-max 60s] [-v] DIR
//
// Each call counts once at its argument's value. The argument must be a
// constant expression: literals, the time package's units, and constants
// declared in the same package or in a package of this module (such as
// harness.PastHold), combined with + - * / and conversions to
// time.Duration. A call whose argument is not one (a variable, a function
// call) cannot be bounded: it is listed and fails the check. A call inside
// a loop is counted once and marked, since how often it runs is not known
// here.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	limit := flag.Duration("max", 60*time.Second, "the largest allowed sum")
	verbose := flag.Bool("v", false, "list every call, not only the sum and the problems")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: sleeps [-max DURATION] [-v] DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	calls, err := scan(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "sleeps:", err)
		os.Exit(2)
	}
	var total time.Duration
	var loose []call
	for _, c := range calls {
		if !c.constant {
			loose = append(loose, c)
			continue
		}
		total += c.d
		if *verbose {
			fmt.Println(c)
		}
	}
	for _, c := range loose {
		fmt.Println(c)
	}
	fmt.Printf("fixed time.Sleep under %s: %d calls, %s in all (bound %s)\n", flag.Arg(0), len(calls)-len(loose), total, *limit)
	failed := false
	if len(loose) > 0 {
		fmt.Printf("%d calls sleep for a length that is not a constant: make it one, or wait on observed state\n", len(loose))
		failed = true
	}
	if total > *limit {
		fmt.Println("the sum is over the bound: wait on observed state, or shorten the timer the test outlasts in its config")
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}

// call is one time.Sleep call.
type call struct {
	pos      token.Position
	d        time.Duration
	constant bool
	inLoop   bool
	expr     string
}

func (c call) String() string {
	if !c.constant {
		return fmt.Sprintf("%s: time.Sleep(%s): not a constant", c.pos, c.expr)
	}
	s := fmt.Sprintf("%s: %s", c.pos, c.d)
	if c.inLoop {
		s += " (in a loop, counted once)"
	}
	return s
}

// scanner parses packages on demand: the scanned ones, and those of the
// module whose constants they name.
type scanner struct {
	fset   *token.FileSet
	module string // the module's path
	root   string // and its directory
	pkgs   map[string]*pkg
}

// pkg is one directory's files and their package-level constants.
type pkg struct {
	files  []*file
	consts scope
}

// file is what evaluating an expression of a file needs: its imports.
type file struct {
	ast     *ast.File
	imports map[string]string // name -> path
}

// binding is a constant's expression and the file it is declared in; a
// nil expr is a name declared twice or not followed (iota).
type binding struct {
	expr ast.Expr
	in   *file
}

// scope is the constants an expression can name, innermost first.
type scope []map[string]binding

func (s scope) lookup(name string) (binding, bool) {
	for _, m := range s {
		if b, ok := m[name]; ok {
			return b, b.expr != nil
		}
	}
	return binding{}, false
}

func scan(root string) ([]call, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	s := &scanner{fset: token.NewFileSet(), pkgs: map[string]*pkg{}}
	if s.root, s.module, err = findModule(abs); err != nil {
		return nil, err
	}
	var dirs []string
	err = filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(dirs)
	var out []call
	for _, d := range dirs {
		p, err := s.load(d)
		if err != nil {
			return nil, err
		}
		for _, f := range p.files {
			out = append(out, s.calls(p, f)...)
		}
	}
	for i := range out {
		if rel, err := filepath.Rel(filepath.Dir(abs), out[i].pos.Filename); err == nil {
			out[i].pos.Filename = filepath.Join(filepath.Dir(root), rel)
		}
	}
	return out, nil
}

// findModule finds the go.mod above dir: its directory and module path.
func findModule(dir string) (root, module string, err error) {
	for d := dir; ; d = filepath.Dir(d) {
		f, err := os.Open(filepath.Join(d, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return d, strings.TrimSpace(m), nil
				}
			}
			return "", "", fmt.Errorf("%s/go.mod names no module", d)
		}
		if d == filepath.Dir(d) {
			return "", "", errors.New("no go.mod above " + dir)
		}
	}
}

// load parses the Go files of dir (tests included) once.
func (s *scanner) load(dir string) (*pkg, error) {
	if p, ok := s.pkgs[dir]; ok {
		return p, nil
	}
	p := &pkg{consts: scope{{}}}
	s.pkgs[dir] = p
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		af, err := parser.ParseFile(s.fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			return nil, err
		}
		f := &file{ast: af, imports: map[string]string{}}
		for _, im := range af.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			name := filepath.Base(path)
			if im.Name != nil {
				name = im.Name.Name
			}
			f.imports[name] = path
		}
		p.files = append(p.files, f)
		declare(p.consts[0], af.Decls, f)
	}
	return p, nil
}

// declare adds the constants of decls, declared in f, to m.
func declare(m map[string]binding, decls []ast.Decl, f *file) {
	for _, d := range decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				_, seen := m[name.Name]
				if seen || i >= len(vs.Values) {
					m[name.Name] = binding{}
					continue
				}
				m[name.Name] = binding{expr: vs.Values[i], in: f}
			}
		}
	}
}

// calls finds the time.Sleep calls of f.
func (s *scanner) calls(p *pkg, f *file) []call {
	var out []call
	var stack []ast.Node
	ast.Inspect(f.ast, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		c, ok := n.(*ast.CallExpr)
		if !ok || !f.isSelector(c.Fun, "time", "Sleep") || len(c.Args) != 1 {
			return true
		}
		var sc scope
		for i := len(stack) - 1; i >= 0; i-- {
			if b, ok := stack[i].(*ast.BlockStmt); ok {
				m := map[string]binding{}
				var decls []ast.Decl
				for _, st := range b.List {
					if ds, ok := st.(*ast.DeclStmt); ok {
						decls = append(decls, ds.Decl)
					}
				}
				declare(m, decls, f)
				sc = append(sc, m)
			}
		}
		sc = append(sc, p.consts...)
		cl := call{pos: s.fset.Position(c.Pos()), inLoop: inLoop(stack), expr: s.source(c.Args[0])}
		if v, ok := s.eval(c.Args[0], f, sc, map[ast.Expr]bool{}); ok {
			d, exact := constant.Int64Val(constant.ToInt(v))
			cl.d, cl.constant = time.Duration(d), exact
		}
		out = append(out, cl)
		return true
	})
	return out
}

// isSelector reports whether e is pkgPath's sel, as f names it.
func (f *file) isSelector(e ast.Expr, pkgPath, sel string) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok || s.Sel.Name != sel {
		return false
	}
	id, ok := s.X.(*ast.Ident)
	return ok && f.imports[id.Name] == pkgPath
}

// inLoop reports whether the innermost function around the call has a
// loop around it.
func inLoop(stack []ast.Node) bool {
	for i := len(stack) - 1; i >= 0; i-- {
		switch stack[i].(type) {
		case *ast.ForStmt, *ast.RangeStmt:
			return true
		case *ast.FuncDecl, *ast.FuncLit:
			return false
		}
	}
	return false
}

var units = map[string]time.Duration{
	"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
	"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour,
}

// eval is the value of a constant expression of f, ok false for anything
// else.
func (s *scanner) eval(e ast.Expr, f *file, sc scope, visiting map[ast.Expr]bool) (constant.Value, bool) {
	if visiting[e] {
		return nil, false
	}
	visiting[e] = true
	defer delete(visiting, e)
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.INT && e.Kind != token.FLOAT {
			return nil, false
		}
		v := constant.MakeFromLiteral(e.Value, e.Kind, 0)
		return v, v.Kind() != constant.Unknown
	case *ast.ParenExpr:
		return s.eval(e.X, f, sc, visiting)
	case *ast.Ident:
		b, ok := sc.lookup(e.Name)
		if !ok {
			return nil, false
		}
		if b.in != f {
			// Declared at package level in another file of the package.
			return s.eval(b.expr, b.in, sc[len(sc)-1:], visiting)
		}
		return s.eval(b.expr, f, sc, visiting)
	case *ast.SelectorExpr:
		if u, ok := units[e.Sel.Name]; ok && f.isSelector(e, "time", e.Sel.Name) {
			return constant.MakeInt64(int64(u)), true
		}
		id, ok := e.X.(*ast.Ident)
		if !ok {
			return nil, false
		}
		rel, ok := strings.CutPrefix(f.imports[id.Name], s.module+"/")
		if !ok {
			return nil, false
		}
		other, err := s.load(filepath.Join(s.root, filepath.FromSlash(rel)))
		if err != nil {
			return nil, false
		}
		b, ok := other.consts.lookup(e.Sel.Name)
		if !ok {
			return nil, false
		}
		return s.eval(b.expr, b.in, other.consts, visiting)
	case *ast.UnaryExpr:
		x, ok := s.eval(e.X, f, sc, visiting)
		if !ok || (e.Op != token.SUB && e.Op != token.ADD) {
			return nil, false
		}
		return constant.UnaryOp(e.Op, x, 0), true
	case *ast.BinaryExpr:
		x, okx := s.eval(e.X, f, sc, visiting)
		y, oky := s.eval(e.Y, f, sc, visiting)
		if !okx || !oky {
			return nil, false
		}
		switch e.Op {
		case token.ADD, token.SUB, token.MUL:
			return constant.BinaryOp(x, e.Op, y), true
		case token.QUO:
			if constant.Sign(y) == 0 {
				return nil, false
			}
			op := token.QUO
			if x.Kind() == constant.Int && y.Kind() == constant.Int {
				op = token.QUO_ASSIGN // integer division, as Go does for integer constants
			}
			return constant.BinaryOp(x, op, y), true
		}
		return nil, false
	case *ast.CallExpr:
		// A conversion: time.Duration(x).
		if len(e.Args) == 1 && f.isSelector(e.Fun, "time", "Duration") {
			return s.eval(e.Args[0], f, sc, visiting)
		}
		return nil, false
	}
	return nil, false
}

func (s *scanner) source(e ast.Expr) string {
	start, end := s.fset.Position(e.Pos()), s.fset.Position(e.End())
	data, err := os.ReadFile(start.Filename)
	if err != nil || end.Offset > len(data) {
		return "?"
	}
	return string(data[start.Offset:end.Offset])
}
