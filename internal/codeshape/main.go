// Command codeshape measures how one Go package is laid out inside: its files and their lengths,
// its longest functions, the methods each type receives, and the arrows between its files. It is
// how the structure figures in issues and docs are counted, so that anyone can count them again.
//
// An arrow runs from file A to file B when code in A uses something declared at package level in
// B (a function, method, type, variable or constant). An arrow is "in a circle" when B also
// reaches A, directly or through other files: such files can only be understood together. Fewer
// arrows in circles is a package that reads top-down. Test files are left out.
//
//	go run ./internal/codeshape ./runtime               # the summary
//	go run ./internal/codeshape -files -funcs 80 ./runtime   # every file, and functions over 80 lines
//
// It reads code; it does not judge it. The figures say where to look, not what to do.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	listFiles := flag.Bool("files", false, "list every file with its lines")
	funcsOver := flag.Int("funcs", 0, "list the functions longer than this many lines (0: only the longest)")
	arrows := flag.Bool("arrows", false, "list the arrows in circles")
	flag.Usage = func() {
		_, _ = fmt.Fprintln(flag.CommandLine.Output(), "usage: codeshape [-files] [-funcs N] [-arrows] PACKAGE") // stderr: nowhere better to report to
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	pkg, err := load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "codeshape:", err)
		os.Exit(1)
	}
	s := measure(pkg)
	if _, err := io.WriteString(os.Stdout, s.text(*listFiles, *funcsOver, *arrows)); err != nil {
		fmt.Fprintln(os.Stderr, "codeshape:", err)
		os.Exit(1)
	}
}

func load(pattern string) (*packages.Package, error) {
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax |
		packages.NeedTypes | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, pattern)
	if err != nil {
		return nil, err
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("%s names %d packages: name one", pattern, len(pkgs))
	}
	if len(pkgs[0].Errors) > 0 {
		return nil, fmt.Errorf("%s: %v", pattern, pkgs[0].Errors[0])
	}
	return pkgs[0], nil
}

type fileShape struct {
	name  string
	lines int
}

type funcShape struct {
	name  string // Recv.Name or Name
	file  string
	lines int
}

type arrow struct{ from, to string }

type shape struct {
	pkg       string
	files     []fileShape
	funcs     []funcShape
	receivers map[string]int // methods per receiver type
	arrows    map[arrow]bool
	circled   map[arrow]bool
}

func measure(pkg *packages.Package) *shape {
	s := &shape{pkg: pkg.PkgPath, receivers: map[string]int{}, arrows: map[arrow]bool{}}
	declaredIn := map[types.Object]string{}
	for _, f := range pkg.Syntax {
		name := filepath.Base(pkg.Fset.Position(f.Pos()).Filename)
		s.files = append(s.files, fileShape{name, pkg.Fset.Position(f.End()).Line})
		for _, d := range f.Decls {
			recordDecl(pkg, d, name, declaredIn, s)
		}
	}
	for _, f := range pkg.Syntax {
		from := filepath.Base(pkg.Fset.Position(f.Pos()).Filename)
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			obj := pkg.TypesInfo.Uses[id]
			if to, ok := declaredIn[obj]; ok && to != from {
				s.arrows[arrow{from, to}] = true
			}
			return true
		})
	}
	s.circled = inCircles(s.arrows)
	return s
}

// recordDecl notes where each package-level object is declared, and the length of functions.
func recordDecl(pkg *packages.Package, d ast.Decl, file string, declaredIn map[types.Object]string, s *shape) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		declaredIn[pkg.TypesInfo.Defs[d.Name]] = file
		name := d.Name.Name
		if d.Recv != nil && len(d.Recv.List) == 1 {
			recv := receiverName(d.Recv.List[0].Type)
			s.receivers[recv]++
			name = recv + "." + name
		}
		lines := pkg.Fset.Position(d.End()).Line - pkg.Fset.Position(d.Pos()).Line + 1
		s.funcs = append(s.funcs, funcShape{name, file, lines})
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch spec := spec.(type) {
			case *ast.TypeSpec:
				declaredIn[pkg.TypesInfo.Defs[spec.Name]] = file
			case *ast.ValueSpec:
				for _, n := range spec.Names {
					declaredIn[pkg.TypesInfo.Defs[n]] = file
				}
			}
		}
	}
}

func receiverName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverName(e.X)
	case *ast.IndexExpr:
		return receiverName(e.X)
	case *ast.IndexListExpr:
		return receiverName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}

// inCircles returns the arrows whose two files lie in one strongly connected component (Tarjan).
func inCircles(arrows map[arrow]bool) map[arrow]bool {
	next := map[string][]string{}
	for a := range arrows {
		next[a.from] = append(next[a.from], a.to)
	}
	index, low, onStack, component := map[string]int{}, map[string]int{}, map[string]bool{}, map[string]int{}
	var stack []string
	counter, components := 0, 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = counter, counter
		counter++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range next[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				component[w] = components
				if w == v {
					break
				}
			}
			components++
		}
	}
	nodes := make([]string, 0, len(next))
	for v := range next {
		nodes = append(nodes, v)
	}
	sort.Strings(nodes)
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	circled := map[arrow]bool{}
	for a := range arrows {
		if component[a.from] == component[a.to] {
			circled[a] = true
		}
	}
	return circled
}

// text is the report that main prints.
func (s *shape) text(listFiles bool, funcsOver int, listArrows bool) string {
	var b strings.Builder
	w := &b
	sort.Slice(s.files, func(i, j int) bool { return s.files[i].lines > s.files[j].lines })
	sort.Slice(s.funcs, func(i, j int) bool { return s.funcs[i].lines > s.funcs[j].lines })
	total := 0
	for _, f := range s.files {
		total += f.lines
	}
	fmt.Fprintf(w, "package %s: %d files, %d lines\n", s.pkg, len(s.files), total)
	if len(s.files) > 0 {
		fmt.Fprintf(w, "longest file: %s, %d lines\n", s.files[0].name, s.files[0].lines)
	}
	if len(s.funcs) > 0 {
		f := s.funcs[0]
		fmt.Fprintf(w, "longest function: %s (%s), %d lines\n", f.name, f.file, f.lines)
	}
	fmt.Fprintf(w, "arrows between files: %d, in circles: %d\n", len(s.arrows), len(s.circled))
	fmt.Fprintf(w, "methods per receiver:")
	for _, r := range sortedByCount(s.receivers, 5) {
		fmt.Fprintf(w, " %s %d", r, s.receivers[r])
	}
	fmt.Fprintln(w)
	if listFiles {
		for _, f := range s.files {
			fmt.Fprintf(w, "  %5d  %s\n", f.lines, f.name)
		}
	}
	for _, f := range s.funcs {
		if funcsOver <= 0 || f.lines <= funcsOver {
			break
		}
		fmt.Fprintf(w, "  %5d  %s (%s)\n", f.lines, f.name, f.file)
	}
	if listArrows {
		var all []arrow
		for a := range s.circled {
			all = append(all, a)
		}
		sort.Slice(all, func(i, j int) bool {
			return all[i].from < all[j].from || all[i].from == all[j].from && all[i].to < all[j].to
		})
		for _, a := range all {
			fmt.Fprintf(w, "  %s -> %s\n", a.from, a.to)
		}
	}
	return b.String()
}

func sortedByCount(m map[string]int, most int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	if len(keys) > most {
		keys = keys[:most]
	}
	return keys
}
