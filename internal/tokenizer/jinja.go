package tokenizer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// This file is a deliberately small Jinja interpreter: enough for the chat
// templates of the families sluice runs (for/if/elif/else/set, macros,
// namespaces, string concatenation, comparisons, conditional expressions,
// boolean logic, attribute, index and slice access, list literals,
// loop.*, the filters and methods of jinja_ext.go, and type tests).
// Anything else is a parse or render error, which the caller turns into
// the announced ChatML fallback instead of guessing.
//
// Whitespace follows Hugging Face's environment: trim_blocks=True and
// lstrip_blocks=True, plus explicit "-" / "+" markers on tags.

// errUnsupported marks template features outside the subset.
var errUnsupported = errors.New("unsupported template feature")

// undefined is the value of a missing variable or key. As with Jinja's
// default Undefined it renders as "" and is false, but using it in
// arithmetic or attribute access is an error.
type undefined struct{}

// template is a parsed Jinja template.
type template struct {
	body []node
}

type node interface{}

type textNode struct{ text string }

type outputNode struct{ e expr }

type ifNode struct {
	conds  []expr
	bodies [][]node // len(bodies) == len(conds) or len(conds)+1 with else
}

type forNode struct {
	varName string
	names   []string // loop targets: one, or two unpacking pairs
	iter    expr
	body    []node
}

type setNode struct {
	name string
	e    expr
}

// segment is one lexed piece of template source.
type segment struct {
	kind byte // 't' text, 'o' output {{ }}, 'b' block {% %}
	text string
	toks []token
}

// parseTemplate lexes and parses src.
func parseTemplate(src string) (*template, error) {
	segs, err := lexTemplate(src)
	if err != nil {
		return nil, err
	}
	p := &tmplParser{segs: segs}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, fmt.Errorf("unexpected {%% %s %%}", end)
	}
	return &template{body: body}, nil
}

func lexTemplate(src string) ([]segment, error) {
	// Jinja's lexer turns every newline form into "\n" and, with the
	// default keep_trailing_newline=False, drops one final newline.
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var segs []segment
	i := 0
	for i < len(src) {
		j := indexTagOpen(src, i)
		if j < 0 {
			segs = append(segs, segment{kind: 't', text: src[i:]})
			break
		}
		text := src[i:j]
		opener := src[j+1]
		k := j + 2
		strip, plus := false, false
		if k < len(src) && src[k] == '-' {
			strip = true
			k++
		} else if k < len(src) && src[k] == '+' {
			plus = true
			k++
		}
		switch {
		case strip:
			text = strings.TrimRightFunc(text, unicode.IsSpace)
		case opener != '{' && !plus:
			// lstrip_blocks: drop spaces/tabs between the line start and
			// a block or comment tag that begins its line.
			l := strings.LastIndexByte(text, '\n') + 1
			lineStart := l > 0 || i == 0 || src[i-1] == '\n'
			if lineStart && strings.Trim(text[l:], " \t") == "" {
				text = text[:l]
			}
		}
		if text != "" {
			segs = append(segs, segment{kind: 't', text: text})
		}

		var end int     // index just after the closing delimiter
		var rstrip bool // closer had "-"
		var rplus bool  // closer had "+"
		switch opener {
		case '#':
			c := strings.Index(src[k:], "#}")
			if c < 0 {
				return nil, fmt.Errorf("unclosed comment at offset %d", j)
			}
			c += k
			rstrip = c > k && src[c-1] == '-'
			end = c + 2
		default:
			closer := "}}"
			if opener == '%' {
				closer = "%}"
			}
			toks, stop, err := lexExpr(src, k, closer)
			if err != nil {
				return nil, err
			}
			end = stop + 2
			if stop > 0 && src[stop-1] == '-' {
				rstrip = true
			}
			if stop > 0 && src[stop-1] == '+' {
				rplus = true
			}
			kind := byte('o')
			if opener == '%' {
				kind = 'b'
			}
			segs = append(segs, segment{kind: kind, toks: toks})
		}
		i = end
		switch {
		case rstrip:
			for i < len(src) && unicode.IsSpace(rune(src[i])) {
				i++
			}
		case opener != '{' && !rplus:
			// trim_blocks: remove the first newline after a block tag.
			if i < len(src) && src[i] == '\n' {
				i++
			}
		}
	}
	return segs, nil
}

// indexTagOpen finds the next "{{", "{%" or "{#" at or after i.
func indexTagOpen(src string, i int) int {
	for {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			return -1
		}
		j += i
		if c := src[j+1]; c == '{' || c == '%' || c == '#' {
			return j
		}
		i = j + 1
	}
}

// token is one lexical token of an expression.
type token struct {
	kind byte // 'n' name, 's' string, 'i' integer, 'o' operator
	val  string
	num  int
}

// lexExpr tokenises from src[i:] until the closer ("}}" or "%}", optionally
// preceded by "-" or "+") and returns the tokens and the closer's offset.
func lexExpr(src string, i int, closer string) ([]token, int, error) {
	var toks []token
	for i < len(src) {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(src[i:], closer):
			return toks, i, nil
		case (c == '-' || c == '+') && strings.HasPrefix(src[i+1:], closer):
			return toks, i + 1, nil
		case c == '_' || c < 0x80 && unicode.IsLetter(rune(c)):
			j := i + 1
			for j < len(src) && (src[j] == '_' || src[j] < 0x80 && (unicode.IsLetter(rune(src[j])) || unicode.IsDigit(rune(src[j])))) {
				j++
			}
			toks = append(toks, token{kind: 'n', val: src[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(src) && src[j] >= '0' && src[j] <= '9' {
				j++
			}
			if j < len(src) && src[j] == '.' {
				return nil, 0, fmt.Errorf("%w: float literal at offset %d", errUnsupported, i)
			}
			n, err := strconv.Atoi(src[i:j])
			if err != nil {
				return nil, 0, fmt.Errorf("bad integer %q: %w", src[i:j], err)
			}
			toks = append(toks, token{kind: 'i', num: n})
			i = j
		case c == '\'' || c == '"':
			s, n, err := lexString(src[i:])
			if err != nil {
				return nil, 0, fmt.Errorf("at offset %d: %w", i, err)
			}
			toks = append(toks, token{kind: 's', val: s})
			i += n
		default:
			op := ""
			for _, cand := range []string{"==", "!=", "<=", ">=", "<", ">", "=", "+", "-", "~", "(", ")", "[", "]", ".", ",", "|", ":", "*", "/", "%"} {
				if strings.HasPrefix(src[i:], cand) {
					op = cand
					break
				}
			}
			if op == "" {
				return nil, 0, fmt.Errorf("%w: character %q at offset %d", errUnsupported, c, i)
			}
			toks = append(toks, token{kind: 'o', val: op})
			i += len(op)
		}
	}
	return nil, 0, fmt.Errorf("unclosed tag: missing %q", closer)
}

// lexString decodes a quoted literal with Python-style escapes and returns
// the value and the number of source bytes consumed.
func lexString(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == q {
			return b.String(), i + 1, nil
		}
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\', '\'', '"':
			b.WriteByte(s[i])
		default:
			// Python keeps unknown escapes verbatim.
			b.WriteByte('\\')
			b.WriteByte(s[i])
		}
	}
	return "", 0, errors.New("unterminated string literal")
}

type tmplParser struct {
	segs []segment
	pos  int
}

// parseBody parses nodes until a block tag that closes or splits the
// enclosing construct (endfor, endif, elif, else), which it returns
// unconsumed as end ("" at end of input).
func (p *tmplParser) parseBody() (body []node, end string, err error) {
	for p.pos < len(p.segs) {
		s := p.segs[p.pos]
		switch s.kind {
		case 't':
			body = append(body, textNode{s.text})
			p.pos++
		case 'o':
			e, err := parseWholeExpr(s.toks)
			if err != nil {
				return nil, "", err
			}
			body = append(body, outputNode{e})
			p.pos++
		case 'b':
			if len(s.toks) == 0 || s.toks[0].kind != 'n' {
				return nil, "", errors.New("empty or malformed block tag")
			}
			switch name := s.toks[0].val; name {
			case "endfor", "endif", "elif", "else", "endmacro":
				return body, name, nil
			case "macro":
				n, err := p.parseMacro()
				if err != nil {
					return nil, "", err
				}
				body = append(body, n)
			case "if":
				n, err := p.parseIf()
				if err != nil {
					return nil, "", err
				}
				body = append(body, n)
			case "for":
				n, err := p.parseFor()
				if err != nil {
					return nil, "", err
				}
				body = append(body, n)
			case "set":
				t := s.toks
				if len(t) >= 6 && t[1].kind == 'n' && t[2].kind == 'o' && t[2].val == "." && t[3].kind == 'n' && t[4].kind == 'o' && t[4].val == "=" {
					// {% set ns.attr = … %}: a namespace attribute.
					e, err := parseWholeExpr(t[5:])
					if err != nil {
						return nil, "", err
					}
					body = append(body, setAttrNode{t[1].val, t[3].val, e})
					p.pos++
					continue
				}
				if len(t) < 4 || t[1].kind != 'n' || t[2].kind != 'o' || t[2].val != "=" {
					// Also rejects block-style {% set x %}...{% endset %}.
					return nil, "", fmt.Errorf("%w: set statement form", errUnsupported)
				}
				e, err := parseWholeExpr(t[3:])
				if err != nil {
					return nil, "", err
				}
				body = append(body, setNode{t[1].val, e})
				p.pos++
			default:
				return nil, "", fmt.Errorf("%w: tag %q", errUnsupported, name)
			}
		}
	}
	return body, "", nil
}

func (p *tmplParser) parseIf() (node, error) {
	n := &ifNode{}
	cond, err := parseWholeExpr(p.segs[p.pos].toks[1:])
	if err != nil {
		return nil, err
	}
	n.conds = append(n.conds, cond)
	p.pos++
	for {
		body, end, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		n.bodies = append(n.bodies, body)
		tag := p.segs[min(p.pos, len(p.segs)-1)]
		switch end {
		case "elif":
			if len(n.bodies) > len(n.conds) {
				return nil, errors.New("elif after else")
			}
			c, err := parseWholeExpr(tag.toks[1:])
			if err != nil {
				return nil, err
			}
			n.conds = append(n.conds, c)
			p.pos++
		case "else":
			if len(n.bodies) > len(n.conds) || len(tag.toks) != 1 {
				return nil, errors.New("misplaced or malformed else")
			}
			p.pos++
			body, end, err := p.parseBody()
			if err != nil {
				return nil, err
			}
			if end != "endif" {
				return nil, fmt.Errorf("expected endif after else, got %q", end)
			}
			n.bodies = append(n.bodies, body)
			p.pos++
			return n, nil
		case "endif":
			p.pos++
			return n, nil
		default:
			return nil, fmt.Errorf("if block closed by %q", end)
		}
	}
}

func (p *tmplParser) parseFor() (node, error) {
	t := p.segs[p.pos].toks
	var names []string
	k := 1
	for k < len(t) && t[k].kind == 'n' && t[k].val != "in" {
		names = append(names, t[k].val)
		k++
		if k < len(t) && t[k].kind == 'o' && t[k].val == "," {
			k++
		}
	}
	if len(names) == 0 || len(names) > 2 || k >= len(t)-1 || t[k].kind != 'n' || t[k].val != "in" {
		return nil, fmt.Errorf("%w: for statement form", errUnsupported)
	}
	iter, err := parseWholeExpr(t[k+1:])
	if err != nil {
		return nil, err
	}
	p.pos++
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "endfor" {
		return nil, fmt.Errorf("for block closed by %q", end)
	}
	p.pos++
	return &forNode{varName: names[0], names: names, iter: iter, body: body}, nil
}

// Expressions.

type expr interface {
	eval(s *scope) (any, error)
}

type litExpr struct{ v any }
type nameExpr struct{ name string }
type attrExpr struct {
	obj expr
	key expr
}
type notExpr struct{ e expr }
type negExpr struct{ e expr }
type binExpr struct {
	op   string
	l, r expr
}
type filterExpr struct {
	e    expr
	name string
	args []expr
}
type testExpr struct {
	e      expr
	name   string
	negate bool
}

type exprParser struct {
	toks []token
	pos  int
}

func parseWholeExpr(toks []token) (expr, error) {
	if len(toks) == 0 {
		return nil, errors.New("missing expression")
	}
	p := &exprParser{toks: toks}
	e, err := p.parseTernary()
	if err != nil {
		return nil, err
	}
	if p.pos != len(toks) {
		return nil, fmt.Errorf("%w: unexpected %q in expression", errUnsupported, tokString(toks[p.pos]))
	}
	return e, nil
}

func tokString(t token) string {
	if t.kind == 'i' {
		return strconv.Itoa(t.num)
	}
	return t.val
}

func (p *exprParser) peek(kind byte, val string) bool {
	return p.pos < len(p.toks) && p.toks[p.pos].kind == kind && p.toks[p.pos].val == val
}

func (p *exprParser) accept(kind byte, val string) bool {
	if p.peek(kind, val) {
		p.pos++
		return true
	}
	return false
}

func (p *exprParser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	for err == nil && p.accept('n', "or") {
		var r expr
		r, err = p.parseAnd()
		l = binExpr{"or", l, r}
	}
	return l, err
}

func (p *exprParser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	for err == nil && p.accept('n', "and") {
		var r expr
		r, err = p.parseNot()
		l = binExpr{"and", l, r}
	}
	return l, err
}

func (p *exprParser) parseNot() (expr, error) {
	if p.accept('n', "not") {
		e, err := p.parseNot()
		return notExpr{e}, err
	}
	return p.parseCompare()
}

func (p *exprParser) parseCompare() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for {
		var op string
		switch {
		case p.pos < len(p.toks) && p.toks[p.pos].kind == 'o' && isCompareOp(p.toks[p.pos].val):
			op = p.toks[p.pos].val
			p.pos++
		case p.accept('n', "in"):
			op = "in"
		case p.peek('n', "not") && p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == 'n' && p.toks[p.pos+1].val == "in":
			p.pos += 2
			op = "not in"
		default:
			return l, nil
		}
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		// Chained comparisons (a < b < c) are not supported; a single
		// comparison covers chat templates.
		l = binExpr{op, l, r}
	}
}

func isCompareOp(op string) bool {
	switch op {
	case "==", "!=", "<", ">", "<=", ">=":
		return true
	}
	return false
}

func (p *exprParser) parseConcat() (expr, error) {
	l, err := p.parseAdd()
	for err == nil && p.accept('o', "~") {
		var r expr
		r, err = p.parseAdd()
		l = binExpr{"~", l, r}
	}
	return l, err
}

func (p *exprParser) parseAdd() (expr, error) {
	l, err := p.parseUnary()
	for err == nil {
		var op string
		switch {
		case p.accept('o', "+"):
			op = "+"
		case p.accept('o', "-"):
			op = "-"
		default:
			return l, nil
		}
		var r expr
		r, err = p.parseUnary()
		l = binExpr{op, l, r}
	}
	return l, err
}

func (p *exprParser) parseUnary() (expr, error) {
	if p.accept('o', "-") {
		e, err := p.parseUnary()
		return negExpr{e}, err
	}
	return p.parsePostfix()
}

func (p *exprParser) parsePostfix() (expr, error) {
	e, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	for {
		switch {
		case p.accept('o', "."):
			if p.pos >= len(p.toks) || p.toks[p.pos].kind != 'n' {
				return nil, errors.New("expected a name after '.'")
			}
			name := p.toks[p.pos].val
			p.pos++
			if p.accept('o', "(") {
				args, kw, err := p.parseArgs()
				if err != nil {
					return nil, err
				}
				if len(kw) > 0 || !knownMethod(name) {
					return nil, fmt.Errorf("%w: method %s()", errUnsupported, name)
				}
				e = methodExpr{e, name, args}
				continue
			}
			e = attrExpr{e, litExpr{name}}
		case p.accept('o', "["):
			idx, err := p.parseSubscript()
			if err != nil {
				return nil, err
			}
			if sl, ok := idx.(sliceExpr); ok {
				sl.obj = e
				e = sl
			} else {
				e = attrExpr{e, idx}
			}
		case p.accept('o', "|"):
			if p.pos >= len(p.toks) || p.toks[p.pos].kind != 'n' {
				return nil, errors.New("expected a filter name after '|'")
			}
			name := p.toks[p.pos].val
			p.pos++
			var args []expr
			if p.accept('o', "(") {
				var kw map[string]expr
				var err error
				if args, kw, err = p.parseArgs(); err != nil {
					return nil, err
				}
				if len(kw) > 0 {
					return nil, fmt.Errorf("%w: keyword arguments of filter %q", errUnsupported, name)
				}
			}
			if !knownFilter(name, len(args)) {
				return nil, fmt.Errorf("%w: filter %q", errUnsupported, name)
			}
			e = filterExpr{e, name, args}
		case p.accept('n', "is"):
			neg := p.accept('n', "not")
			if p.pos >= len(p.toks) || p.toks[p.pos].kind != 'n' {
				return nil, errors.New("expected a test name after 'is'")
			}
			name := p.toks[p.pos].val
			p.pos++
			switch name {
			case "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "boolean", "true", "false":
			default:
				return nil, fmt.Errorf("%w: test %q", errUnsupported, name)
			}
			e = testExpr{e, name, neg}
		default:
			return e, nil
		}
	}
}

func (p *exprParser) parsePrimary() (expr, error) {
	if p.pos >= len(p.toks) {
		return nil, errors.New("unexpected end of expression")
	}
	t := p.toks[p.pos]
	p.pos++
	switch t.kind {
	case 's':
		// Adjacent string literals concatenate, as in Python/Jinja.
		s := t.val
		for p.pos < len(p.toks) && p.toks[p.pos].kind == 's' {
			s += p.toks[p.pos].val
			p.pos++
		}
		return litExpr{s}, nil
	case 'i':
		return litExpr{t.num}, nil
	case 'n':
		switch t.val {
		case "true", "True":
			return litExpr{true}, nil
		case "false", "False":
			return litExpr{false}, nil
		case "none", "None":
			return litExpr{nil}, nil
		}
		if p.accept('o', "(") {
			args, kw, err := p.parseArgs()
			if err != nil {
				return nil, err
			}
			return callExpr{t.val, args, kw}, nil
		}
		return nameExpr{t.val}, nil
	case 'o':
		if t.val == "[" {
			return p.parseList()
		}
		if t.val == "(" {
			e, err := p.parseTernary()
			if err != nil {
				return nil, err
			}
			if !p.accept('o', ")") {
				return nil, fmt.Errorf("%w: expected ')' (tuples are not supported)", errUnsupported)
			}
			return e, nil
		}
	}
	return nil, fmt.Errorf("%w: unexpected %q", errUnsupported, tokString(t))
}

// Evaluation.

// scope is a variable frame; for-loop bodies get a child scope so that
// assignments inside them do not leak out, as in Jinja.
type scope struct {
	vars   map[string]any
	parent *scope
}

func (s *scope) lookup(name string) any {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v
		}
	}
	return undefined{}
}

func (n nameExpr) eval(s *scope) (any, error) { return s.lookup(n.name), nil }
func (l litExpr) eval(*scope) (any, error)    { return l.v, nil }

func (a attrExpr) eval(s *scope) (any, error) {
	obj, err := a.obj.eval(s)
	if err != nil {
		return nil, err
	}
	key, err := a.key.eval(s)
	if err != nil {
		return nil, err
	}
	switch o := obj.(type) {
	case *namespace:
		k, ok := key.(string)
		if !ok {
			return nil, fmt.Errorf("namespace attribute must be a string, got %T", key)
		}
		if v, ok := o.vars[k]; ok {
			return v, nil
		}
		return undefined{}, nil
	case map[string]any:
		k, ok := key.(string)
		if !ok {
			return nil, fmt.Errorf("map key must be a string, got %T", key)
		}
		if v, ok := o[k]; ok {
			return v, nil
		}
		return undefined{}, nil
	case []any:
		i, ok := key.(int)
		if !ok {
			return nil, fmt.Errorf("list index must be an integer, got %T", key)
		}
		if i < 0 {
			i += len(o)
		}
		if i < 0 || i >= len(o) {
			return undefined{}, nil
		}
		return o[i], nil
	case string:
		i, ok := key.(int)
		if !ok {
			return nil, fmt.Errorf("%w: attribute of a string", errUnsupported)
		}
		r := []rune(o)
		if i < 0 {
			i += len(r)
		}
		if i < 0 || i >= len(r) {
			return undefined{}, nil
		}
		return string(r[i]), nil
	case undefined:
		return nil, fmt.Errorf("attribute %v of an undefined value", key)
	}
	return nil, fmt.Errorf("cannot index a %T", obj)
}

func (n notExpr) eval(s *scope) (any, error) {
	v, err := n.e.eval(s)
	if err != nil {
		return nil, err
	}
	return !truthy(v), nil
}

func (n negExpr) eval(s *scope) (any, error) {
	v, err := n.e.eval(s)
	if err != nil {
		return nil, err
	}
	i, ok := v.(int)
	if !ok {
		return nil, fmt.Errorf("cannot negate a %T", v)
	}
	return -i, nil
}

func (f filterExpr) eval(s *scope) (any, error) {
	v, err := f.e.eval(s)
	if err != nil {
		return nil, err
	}
	switch f.name {
	case "tojson", "join", "upper", "lower", "string", "items", "first", "last":
		return applyFilter(f.name, v, f.args, s)
	case "trim":
		str, err := toString(v)
		if err != nil {
			return nil, err
		}
		return strings.TrimSpace(str), nil
	case "length":
		switch x := v.(type) {
		case string:
			return len([]rune(x)), nil
		case []any:
			return len(x), nil
		case map[string]any:
			return len(x), nil
		case undefined:
			return 0, nil
		}
		return nil, fmt.Errorf("length of a %T", v)
	}
	return nil, fmt.Errorf("%w: filter %q", errUnsupported, f.name)
}

func (t testExpr) eval(s *scope) (any, error) {
	v, err := t.e.eval(s)
	if err != nil {
		return nil, err
	}
	var r bool
	switch t.name {
	case "defined":
		_, u := v.(undefined)
		r = !u
	case "undefined":
		_, r = v.(undefined)
	case "none":
		r = v == nil
	case "string":
		_, r = v.(string)
	default:
		r = typeTest(t.name, v)
	}
	return r != t.negate, nil
}

func (b binExpr) eval(s *scope) (any, error) {
	l, err := b.l.eval(s)
	if err != nil {
		return nil, err
	}
	// and/or short-circuit and return an operand, like Python.
	switch b.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return b.r.eval(s)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return b.r.eval(s)
	}
	r, err := b.r.eval(s)
	if err != nil {
		return nil, err
	}
	switch b.op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "~":
		ls, err := toString(l)
		if err != nil {
			return nil, err
		}
		rs, err := toString(r)
		if err != nil {
			return nil, err
		}
		return ls + rs, nil
	case "+":
		switch x := l.(type) {
		case string:
			if y, ok := r.(string); ok {
				return x + y, nil
			}
		case int:
			if y, ok := r.(int); ok {
				return x + y, nil
			}
		case []any:
			if y, ok := r.([]any); ok {
				return append(append([]any{}, x...), y...), nil
			}
		}
		return nil, fmt.Errorf("cannot add %T and %T", l, r)
	case "-":
		x, ok1 := l.(int)
		y, ok2 := r.(int)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("cannot subtract %T and %T", l, r)
		}
		return x - y, nil
	case "<", ">", "<=", ">=":
		return compare(b.op, l, r)
	case "in", "not in":
		in, err := contains(r, l)
		if err != nil {
			return nil, err
		}
		return in == (b.op == "in"), nil
	}
	return nil, fmt.Errorf("%w: operator %q", errUnsupported, b.op)
}

func truthy(v any) bool {
	switch x := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return x
	case int:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

func equal(a, b any) bool {
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case int:
		y, ok := b.(int)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case nil:
		return b == nil
	case undefined:
		_, ok := b.(undefined)
		return ok
	}
	return false
}

func compare(op string, a, b any) (bool, error) {
	var c int
	switch x := a.(type) {
	case int:
		y, ok := b.(int)
		if !ok {
			return false, fmt.Errorf("cannot compare %T and %T", a, b)
		}
		c = x - y
	case string:
		y, ok := b.(string)
		if !ok {
			return false, fmt.Errorf("cannot compare %T and %T", a, b)
		}
		c = strings.Compare(x, y)
	default:
		return false, fmt.Errorf("cannot compare %T and %T", a, b)
	}
	switch op {
	case "<":
		return c < 0, nil
	case ">":
		return c > 0, nil
	case "<=":
		return c <= 0, nil
	}
	return c >= 0, nil
}

func contains(container, item any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' needs a string, got %T", item)
		}
		return strings.Contains(c, s), nil
	case []any:
		for _, v := range c {
			if equal(v, item) {
				return true, nil
			}
		}
		return false, nil
	case map[string]any:
		s, ok := item.(string)
		if !ok {
			return false, nil
		}
		_, found := c[s]
		return found, nil
	case undefined:
		return false, nil
	}
	return false, fmt.Errorf("'in' on a %T", container)
}

func toString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int:
		return strconv.Itoa(x), nil
	case bool:
		if x {
			return "True", nil
		}
		return "False", nil
	case nil:
		return "None", nil
	case undefined:
		return "", nil
	}
	return "", fmt.Errorf("%w: printing a %T", errUnsupported, v)
}

// render executes the template with the given top-level variables.
func (t *template) render(vars map[string]any) (string, error) {
	var b strings.Builder
	if err := renderNodes(&b, t.body, &scope{vars: vars, parent: &scope{vars: builtins()}}); err != nil {
		return "", err
	}
	return b.String(), nil
}

func renderNodes(b *strings.Builder, nodes []node, s *scope) error {
	for _, n := range nodes {
		switch n := n.(type) {
		case textNode:
			b.WriteString(n.text)
		case outputNode:
			v, err := n.e.eval(s)
			if err != nil {
				return err
			}
			str, err := toString(v)
			if err != nil {
				return err
			}
			b.WriteString(str)
		case setNode:
			v, err := n.e.eval(s)
			if err != nil {
				return err
			}
			s.vars[n.name] = v
		case setAttrNode:
			ns, ok := s.lookup(n.name).(*namespace)
			if !ok {
				return fmt.Errorf("cannot set attribute %s of %s: not a namespace", n.attr, n.name)
			}
			v, err := n.e.eval(s)
			if err != nil {
				return err
			}
			ns.vars[n.attr] = v
		case *macroNode:
			s.vars[n.name] = &macroValue{n, s}
		case *ifNode:
			for i, body := range n.bodies {
				if i < len(n.conds) {
					v, err := n.conds[i].eval(s)
					if err != nil {
						return err
					}
					if !truthy(v) {
						continue
					}
				}
				if err := renderNodes(b, body, s); err != nil {
					return err
				}
				break
			}
		case *forNode:
			v, err := n.iter.eval(s)
			if err != nil {
				return err
			}
			var items []any
			switch x := v.(type) {
			case []any:
				items = x
			case string:
				for _, r := range x {
					items = append(items, string(r))
				}
			case map[string]any:
				if len(x) > 1 {
					return fmt.Errorf("%w: iterating a dict with several keys (its order is lost)", errUnsupported)
				}
				for k := range x {
					items = append(items, k)
				}
			case undefined:
				// Jinja iterates an undefined value as empty.
			default:
				return fmt.Errorf("%w: iterating over a %T", errUnsupported, v)
			}
			for i, item := range items {
				loop := map[string]any{
					"index0":    i,
					"index":     i + 1,
					"revindex0": len(items) - 1 - i,
					"revindex":  len(items) - i,
					"first":     i == 0,
					"last":      i == len(items)-1,
					"length":    len(items),
				}
				inner := &scope{vars: map[string]any{n.varName: item, "loop": loop}, parent: s}
				if len(n.names) == 2 {
					pair, ok := item.([]any)
					if !ok || len(pair) != 2 {
						return fmt.Errorf("cannot unpack a %T into %s, %s", item, n.names[0], n.names[1])
					}
					inner.vars[n.names[0]], inner.vars[n.names[1]] = pair[0], pair[1]
				}
				if err := renderNodes(b, n.body, inner); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
