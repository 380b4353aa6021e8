// Package fill sets every field of a value to something other than its
// zero value, for tests that must notice a field a hand-written codec
// forgets: filled, encoded and compared with a reference (a round trip, or
// encoding/json), the forgotten field shows up as a difference.
package fill

import (
	"fmt"
	"reflect"
	"strings"
)

// Value fills v, which must be settable, and everything reachable from it:
// structs field by field, pointers with a new value, slices with two
// elements, strings with "s" repeated, numbers with distinct values,
// booleans with true. It reports an error for a kind it cannot fill.
func Value(v reflect.Value) error {
	n := 0
	return value(v, &n)
}

func value(v reflect.Value, n *int) error {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if err := value(v.Field(i), n); err != nil {
				return err
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		return value(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			if err := value(v.Index(i), n); err != nil {
				return err
			}
		}
	case reflect.String:
		v.SetString(strings.Repeat("s", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(-int64(*n) * 1_000_003)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n%200 + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	default:
		return fmt.Errorf("fill: no value for a %s", v.Type())
	}
	return nil
}
