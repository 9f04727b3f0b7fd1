package tokenizer

// The larger half of the Jinja subset, which the released templates of
// DeepSeek-V3.x, gpt-oss (harmony) and Kimi K2 need: namespaces, macros,
// conditional expressions, slices, list literals, a few methods of str,
// list and dict (as Python has them), the tojson/join/upper/lower filters,
// type tests, and transformers' globals raise_exception and strftime_now.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// timeNow is the clock strftime_now reads (tests fix it).
var timeNow = time.Now

type setAttrNode struct {
	name, attr string
	e          expr
}

type macroNode struct {
	name     string
	params   []string
	defaults []expr // per param, nil when required
	body     []node
}

// macroValue is a defined macro: calling it renders its body in a scope
// whose parent is the scope it was defined in (the template's top level).
type macroValue struct {
	m   *macroNode
	def *scope
}

// namespace is Jinja's namespace(): the one object a template may mutate.
type namespace struct{ vars map[string]any }

// builtin is a global function.
type builtin func(args []any, kw map[string]any) (any, error)

// errRaised is raise_exception's error: the template refused the input.
var errRaised = errors.New("template raised an exception")

func builtins() map[string]any {
	return map[string]any{
		"namespace": builtin(func(args []any, kw map[string]any) (any, error) {
			if len(args) > 0 {
				return nil, fmt.Errorf("%w: positional namespace() arguments", errUnsupported)
			}
			ns := &namespace{vars: map[string]any{}}
			for k, v := range kw {
				ns.vars[k] = v
			}
			return ns, nil
		}),
		"raise_exception": builtin(func(args []any, _ map[string]any) (any, error) {
			msg := ""
			if len(args) > 0 {
				msg, _ = toString(args[0])
			}
			return nil, fmt.Errorf("%w: %s", errRaised, msg)
		}),
		"strftime_now": builtin(func(args []any, _ map[string]any) (any, error) {
			f, ok := first(args).(string)
			if !ok {
				return nil, errors.New("strftime_now needs a format string")
			}
			return strftime(timeNow(), f)
		}),
	}
}

func first(a []any) any {
	if len(a) == 0 {
		return undefined{}
	}
	return a[0]
}

// strftime formats t with the C directives chat templates use.
func strftime(t time.Time, f string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'B':
			b.WriteString(t.Month().String())
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("%w: strftime directive %%%c", errUnsupported, f[i])
		}
	}
	return b.String(), nil
}

// parseMacro parses {% macro name(a, b=default) %}…{% endmacro %}.
func (p *tmplParser) parseMacro() (node, error) {
	t := p.segs[p.pos].toks
	if len(t) < 4 || t[1].kind != 'n' || t[2].kind != 'o' || t[2].val != "(" {
		return nil, fmt.Errorf("%w: macro statement form", errUnsupported)
	}
	m := &macroNode{name: t[1].val}
	ep := &exprParser{toks: t, pos: 3}
	for !ep.accept('o', ")") {
		if ep.pos >= len(t) || t[ep.pos].kind != 'n' {
			return nil, errors.New("malformed macro parameters")
		}
		m.params = append(m.params, t[ep.pos].val)
		ep.pos++
		var def expr
		if ep.accept('o', "=") {
			var err error
			if def, err = ep.parseTernary(); err != nil {
				return nil, err
			}
		}
		m.defaults = append(m.defaults, def)
		if !ep.accept('o', ",") && !ep.peek('o', ")") {
			return nil, errors.New("malformed macro parameters")
		}
	}
	if ep.pos != len(t) {
		return nil, errors.New("text after macro parameters")
	}
	p.pos++
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "endmacro" {
		return nil, fmt.Errorf("macro closed by %q", end)
	}
	p.pos++
	m.body = body
	return m, nil
}

// parseTernary parses `a if cond else b` (b undefined when omitted).
func (p *exprParser) parseTernary() (expr, error) {
	e, err := p.parseOr()
	if err != nil || !p.accept('n', "if") {
		return e, err
	}
	cond, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	var alt expr = litExpr{undefined{}}
	if p.accept('n', "else") {
		if alt, err = p.parseTernary(); err != nil {
			return nil, err
		}
	}
	return condExpr{cond, e, alt}, nil
}

// parseArgs parses call arguments after "(" through ")".
func (p *exprParser) parseArgs() ([]expr, map[string]expr, error) {
	var args []expr
	var kw map[string]expr
	for !p.accept('o', ")") {
		if p.pos+1 < len(p.toks) && p.toks[p.pos].kind == 'n' && p.toks[p.pos+1].kind == 'o' && p.toks[p.pos+1].val == "=" {
			name := p.toks[p.pos].val
			p.pos += 2
			e, err := p.parseTernary()
			if err != nil {
				return nil, nil, err
			}
			if kw == nil {
				kw = map[string]expr{}
			}
			kw[name] = e
		} else {
			e, err := p.parseTernary()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, e)
		}
		if !p.accept('o', ",") && !p.peek('o', ")") {
			return nil, nil, errors.New("malformed call arguments")
		}
	}
	return args, kw, nil
}

// parseSubscript parses what follows "[": an index or a slice, through "]".
func (p *exprParser) parseSubscript() (expr, error) {
	var parts [3]expr
	n := 0
	for {
		if !p.peek('o', ":") && !p.peek('o', "]") {
			e, err := p.parseTernary()
			if err != nil {
				return nil, err
			}
			parts[n] = e
		}
		if p.accept('o', "]") {
			break
		}
		if !p.accept('o', ":") || n == 2 {
			return nil, errors.New("malformed subscript")
		}
		n++
	}
	if n == 0 {
		if parts[0] == nil {
			return nil, errors.New("empty subscript")
		}
		return parts[0], nil
	}
	return sliceExpr{start: parts[0], stop: parts[1], step: parts[2]}, nil
}

// parseList parses a list literal after "[".
func (p *exprParser) parseList() (expr, error) {
	var items []expr
	for !p.accept('o', "]") {
		e, err := p.parseTernary()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
		if !p.accept('o', ",") && !p.peek('o', "]") {
			return nil, errors.New("malformed list literal")
		}
	}
	return listExpr{items}, nil
}

type condExpr struct{ cond, yes, no expr }

func (c condExpr) eval(s *scope) (any, error) {
	v, err := c.cond.eval(s)
	if err != nil {
		return nil, err
	}
	if truthy(v) {
		return c.yes.eval(s)
	}
	return c.no.eval(s)
}

type listExpr struct{ items []expr }

func (l listExpr) eval(s *scope) (any, error) {
	out := make([]any, len(l.items))
	for i, e := range l.items {
		v, err := e.eval(s)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

type sliceExpr struct{ obj, start, stop, step expr }

func (sl sliceExpr) eval(s *scope) (any, error) {
	obj, err := sl.obj.eval(s)
	if err != nil {
		return nil, err
	}
	bound := func(e expr) (int, bool, error) {
		if e == nil {
			return 0, false, nil
		}
		v, err := e.eval(s)
		if err != nil {
			return 0, false, err
		}
		if v == nil {
			return 0, false, nil
		}
		i, ok := v.(int)
		if !ok {
			return 0, false, fmt.Errorf("slice bound must be an integer, got %T", v)
		}
		return i, true, nil
	}
	start, hasStart, err := bound(sl.start)
	if err != nil {
		return nil, err
	}
	stop, hasStop, err := bound(sl.stop)
	if err != nil {
		return nil, err
	}
	step, hasStep, err := bound(sl.step)
	if err != nil {
		return nil, err
	}
	if !hasStep {
		step = 1
	}
	if step == 0 {
		return nil, errors.New("slice step cannot be zero")
	}
	var items []any
	var runes []rune
	isStr := false
	switch o := obj.(type) {
	case []any:
		items = o
	case string:
		runes, isStr = []rune(o), true
	default:
		return nil, fmt.Errorf("cannot slice a %T", obj)
	}
	n := len(items)
	if isStr {
		n = len(runes)
	}
	// Python's slice.indices.
	norm := func(i int, has bool, def int, lo, hi int) int {
		if !has {
			return def
		}
		if i < 0 {
			i += n
		}
		return min(max(i, lo), hi)
	}
	var idx []int
	if step > 0 {
		a, b := norm(start, hasStart, 0, 0, n), norm(stop, hasStop, n, 0, n)
		for i := a; i < b; i += step {
			idx = append(idx, i)
		}
	} else {
		a, b := norm(start, hasStart, n-1, -1, n-1), norm(stop, hasStop, -1, -1, n-1)
		for i := a; i > b; i += step {
			idx = append(idx, i)
		}
	}
	if isStr {
		out := make([]rune, len(idx))
		for j, i := range idx {
			out[j] = runes[i]
		}
		return string(out), nil
	}
	out := make([]any, len(idx))
	for j, i := range idx {
		out[j] = items[i]
	}
	return out, nil
}

type callExpr struct {
	name string
	args []expr
	kw   map[string]expr
}

func (c callExpr) eval(s *scope) (any, error) {
	args := make([]any, len(c.args))
	for i, e := range c.args {
		v, err := e.eval(s)
		if err != nil {
			return nil, err
		}
		args[i] = v
	}
	kw := map[string]any{}
	for k, e := range c.kw {
		v, err := e.eval(s)
		if err != nil {
			return nil, err
		}
		kw[k] = v
	}
	switch f := s.lookup(c.name).(type) {
	case builtin:
		return f(args, kw)
	case *macroValue:
		return f.call(args, kw)
	case undefined:
		return nil, fmt.Errorf("%w: function %s()", errUnsupported, c.name)
	default:
		return nil, fmt.Errorf("%s is a %T, not callable", c.name, f)
	}
}

func (m *macroValue) call(args []any, kw map[string]any) (any, error) {
	if len(args) > len(m.m.params) {
		return nil, fmt.Errorf("macro %s takes %d arguments, got %d", m.m.name, len(m.m.params), len(args))
	}
	local := &scope{vars: map[string]any{}, parent: m.def}
	for i, name := range m.m.params {
		switch v, ok := kw[name]; {
		case i < len(args):
			local.vars[name] = args[i]
		case ok:
			local.vars[name] = v
		case m.m.defaults[i] != nil:
			d, err := m.m.defaults[i].eval(m.def)
			if err != nil {
				return nil, err
			}
			local.vars[name] = d
		default:
			local.vars[name] = undefined{}
		}
	}
	for k := range kw {
		if !containsString(m.m.params, k) {
			return nil, fmt.Errorf("%w: macro %s has no parameter %s", errUnsupported, m.m.name, k)
		}
	}
	var b strings.Builder
	if err := renderNodes(&b, m.m.body, local); err != nil {
		return nil, err
	}
	return b.String(), nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

type methodExpr struct {
	obj  expr
	name string
	args []expr
}

func knownMethod(name string) bool {
	switch name {
	case "split", "strip", "lstrip", "rstrip", "startswith", "endswith", "upper", "lower", "replace", "get", "items", "keys", "values":
		return true
	}
	return false
}

func (m methodExpr) eval(s *scope) (any, error) {
	obj, err := m.obj.eval(s)
	if err != nil {
		return nil, err
	}
	args := make([]any, len(m.args))
	for i, e := range m.args {
		if args[i], err = e.eval(s); err != nil {
			return nil, err
		}
	}
	strArg := func(i int) (string, bool) {
		if i >= len(args) {
			return "", false
		}
		v, ok := args[i].(string)
		return v, ok
	}
	switch o := obj.(type) {
	case string:
		switch m.name {
		case "split":
			sep, ok := strArg(0)
			n := -1
			if len(args) > 1 {
				k, isInt := args[1].(int)
				if !isInt {
					return nil, errors.New("split: maxsplit must be an integer")
				}
				n = k + 1
			}
			var parts []string
			switch {
			case !ok && (len(args) == 0 || args[0] == nil):
				if n >= 0 {
					return nil, fmt.Errorf("%w: whitespace split with maxsplit", errUnsupported)
				}
				parts = strings.Fields(o)
			case !ok || sep == "":
				return nil, errors.New("split: empty or non-string separator")
			default:
				parts = strings.SplitN(o, sep, n)
			}
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out, nil
		case "strip", "lstrip", "rstrip":
			cut, ok := strArg(0)
			if !ok {
				if len(args) > 0 && args[0] != nil {
					return nil, errors.New(m.name + ": non-string argument")
				}
				cut = " \t\n\r\v\f"
			}
			switch m.name {
			case "strip":
				return strings.Trim(o, cut), nil
			case "lstrip":
				return strings.TrimLeft(o, cut), nil
			}
			return strings.TrimRight(o, cut), nil
		case "startswith", "endswith":
			x, ok := strArg(0)
			if !ok {
				return nil, fmt.Errorf("%w: %s without a string", errUnsupported, m.name)
			}
			if m.name == "startswith" {
				return strings.HasPrefix(o, x), nil
			}
			return strings.HasSuffix(o, x), nil
		case "upper":
			return strings.ToUpper(o), nil
		case "lower":
			return strings.ToLower(o), nil
		case "replace":
			a, ok1 := strArg(0)
			b, ok2 := strArg(1)
			if !ok1 || !ok2 || len(args) > 2 {
				return nil, fmt.Errorf("%w: replace form", errUnsupported)
			}
			return strings.ReplaceAll(o, a, b), nil
		}
	case map[string]any:
		switch m.name {
		case "get":
			k, ok := strArg(0)
			if !ok {
				return nil, errors.New("get: key must be a string")
			}
			if v, found := o[k]; found {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		case "items", "keys", "values":
			if len(o) > 1 {
				// Python keeps a dict's insertion order, which a Go map
				// has lost: refuse rather than render another order.
				return nil, fmt.Errorf("%w: %s() of a dict with several keys", errUnsupported, m.name)
			}
			var out []any
			for k, v := range o {
				switch m.name {
				case "items":
					out = append(out, []any{k, v})
				case "keys":
					out = append(out, k)
				default:
					out = append(out, v)
				}
			}
			return out, nil
		}
	case undefined:
		return nil, fmt.Errorf("method %s of an undefined value", m.name)
	}
	return nil, fmt.Errorf("%w: method %s of a %T", errUnsupported, m.name, obj)
}

func knownFilter(name string, nargs int) bool {
	switch name {
	case "trim", "length", "upper", "lower", "string", "first", "last", "tojson", "items":
		return nargs == 0
	case "join":
		return nargs <= 1
	}
	return false
}

func applyFilter(name string, v any, argExprs []expr, s *scope) (any, error) {
	args := make([]any, len(argExprs))
	for i, e := range argExprs {
		var err error
		if args[i], err = e.eval(s); err != nil {
			return nil, err
		}
	}
	switch name {
	case "tojson":
		var b strings.Builder
		if err := writeJSON(&b, v); err != nil {
			return nil, err
		}
		return b.String(), nil
	case "join":
		sep := ""
		if len(args) == 1 {
			var ok bool
			if sep, ok = args[0].(string); !ok {
				return nil, errors.New("join: separator must be a string")
			}
		}
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("join of a %T", v)
		}
		parts := make([]string, len(list))
		for i, x := range list {
			str, err := toString(x)
			if err != nil {
				return nil, err
			}
			parts[i] = str
		}
		return strings.Join(parts, sep), nil
	case "upper", "lower":
		str, err := toString(v)
		if err != nil {
			return nil, err
		}
		if name == "upper" {
			return strings.ToUpper(str), nil
		}
		return strings.ToLower(str), nil
	case "string":
		return toString(v)
	case "first", "last":
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return undefined{}, nil
		}
		if name == "first" {
			return list[0], nil
		}
		return list[len(list)-1], nil
	case "items":
		return methodExpr{litExpr{v}, "items", nil}.eval(s)
	}
	return nil, fmt.Errorf("%w: filter %q", errUnsupported, name)
}

// writeJSON writes v as transformers' tojson does: json.dumps with
// ensure_ascii=False and the default ", " and ": " separators.
func writeJSON(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int:
		b.WriteString(strconv.Itoa(x))
	case string:
		b.WriteByte('"')
		for _, r := range x {
			switch r {
			case '"':
				b.WriteString(`\"`)
			case '\\':
				b.WriteString(`\\`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			default:
				if r < 0x20 {
					fmt.Fprintf(b, `\u%04x`, r)
				} else if r == utf8.RuneError {
					return errors.New("tojson: invalid UTF-8")
				} else {
					b.WriteRune(r)
				}
			}
		}
		b.WriteByte('"')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeJSON(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		if len(x) > 1 {
			return fmt.Errorf("%w: tojson of a dict with several keys (its order is lost)", errUnsupported)
		}
		b.WriteByte('{')
		for k, e := range x {
			if err := writeJSON(b, k); err != nil {
				return err
			}
			b.WriteString(": ")
			if err := writeJSON(b, e); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case undefined:
		return errors.New("tojson of an undefined value")
	default:
		return fmt.Errorf("%w: tojson of a %T", errUnsupported, v)
	}
	return nil
}

// typeTest is Jinja's is-tests beyond defined/none/string.
func typeTest(name string, v any) bool {
	switch name {
	case "mapping":
		_, ok := v.(map[string]any)
		return ok
	case "iterable":
		switch v.(type) {
		case string, []any, map[string]any:
			return true
		}
	case "sequence":
		switch v.(type) {
		case string, []any, map[string]any:
			return true
		}
	case "number":
		switch v.(type) {
		case int, float64:
			return true
		}
	case "integer":
		_, ok := v.(int)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "true":
		b, ok := v.(bool)
		return ok && b
	case "false":
		b, ok := v.(bool)
		return ok && !b
	}
	return false
}
