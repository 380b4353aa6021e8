package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/big"
)

// reducer folds integers with one operation. Integers are arbitrary
// precision, so sums never overflow.
type reducer struct {
	op    string
	n     int64
	acc   *big.Int
	valid bool
}

var ops = map[string]bool{"sum": true, "max": true, "min": true, "count": true}

func newReducer(op string) (*reducer, error) {
	if !ops[op] {
		return nil, fmt.Errorf("unknown operation %q (want sum, max, min or count)", op)
	}
	return &reducer{op: op, acc: new(big.Int)}, nil
}

func (r *reducer) add(v *big.Int) {
	r.n++
	switch r.op {
	case "sum":
		r.acc.Add(r.acc, v)
	case "max":
		if !r.valid || v.Cmp(r.acc) > 0 {
			r.acc.Set(v)
		}
	case "min":
		if !r.valid || v.Cmp(r.acc) < 0 {
			r.acc.Set(v)
		}
	}
	r.valid = true
}

// addFrom adds every whitespace-separated integer read from rd; name is used
// in error messages.
func (r *reducer) addFrom(name string, rd io.Reader) error {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	sc.Split(bufio.ScanWords)
	v := new(big.Int)
	for sc.Scan() {
		w := sc.Bytes()
		if _, ok := v.SetString(string(bytes.TrimPrefix(w, []byte("+"))), 10); !ok {
			return fmt.Errorf("%s: %q is not an integer", name, w)
		}
		r.add(v)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func (r *reducer) result() (string, error) {
	switch r.op {
	case "count":
		return fmt.Sprint(r.n), nil
	case "sum":
		return r.acc.String(), nil
	}
	if !r.valid {
		return "", errors.New(r.op + " of no numbers")
	}
	return r.acc.String(), nil
}
