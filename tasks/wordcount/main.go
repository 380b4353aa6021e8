// Command wordcount is an example task that reads a shared dataset from a
// mounted blob (docs/DATA.md). It has two modes:
//
//	wordcount count PART PARTS
//	    counts the words of part PART (from 0) of PARTS equal byte ranges
//	    of the file named by $CORPUS. A word belongs to the part its first
//	    byte is in, so the parts together count every word once. Words are
//	    lower-cased runs of letters; those listed in conf/stopwords.txt
//	    (relative to the working directory) are left out. Writes
//	    /out/counts.tsv: "word<TAB>count" lines sorted by word.
//	wordcount reduce
//	    adds up every counts file under /in and writes the total to
//	    /out/counts.tsv and the $TOP most frequent words (default 10) to
//	    top.txt in the working directory.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: wordcount count PART PARTS | wordcount reduce"))
	}
	var counts map[string]int
	var err error
	switch os.Args[1] {
	case "count":
		counts, err = count(os.Args[2:])
	case "reduce":
		counts, err = reduce()
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
	if err := writeCounts("/out/counts.tsv", counts); err != nil {
		fail(err)
	}
	if os.Args[1] == "reduce" {
		n, _ := strconv.Atoi(os.Getenv("TOP"))
		if n <= 0 {
			n = 10
		}
		if err := writeTop("top.txt", counts, n); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wordcount:", err)
	os.Exit(1)
}

func count(args []string) (map[string]int, error) {
	if len(args) != 2 {
		return nil, fmt.Errorf("count wants PART PARTS")
	}
	part, err1 := strconv.Atoi(args[0])
	parts, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || parts < 1 || part < 0 || part >= parts {
		return nil, fmt.Errorf("bad part %q of %q", args[0], args[1])
	}
	stop := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join("conf", "stopwords.txt")); err == nil {
		for _, w := range strings.Fields(string(b)) {
			stop[strings.ToLower(w)] = true
		}
	} else if !os.IsNotExist(err) {
		return nil, err
	}
	f, err := os.Open(os.Getenv("CORPUS"))
	if err != nil {
		return nil, fmt.Errorf("the corpus ($CORPUS): %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	start, end := size*int64(part)/int64(parts), size*int64(part+1)/int64(parts)
	// A word that starts before start is the previous part's: skip to the
	// first byte after it.
	begin := start
	if start > 0 {
		begin = start - 1
	}
	r := bufio.NewReader(io.NewSectionReader(f, begin, size-begin))
	counts := map[string]int{}
	pos := begin
	var word []rune
	inWord, skipping := false, start > 0
	for {
		c, n, err := r.ReadRune()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		letter := unicode.IsLetter(c)
		switch {
		case letter && !inWord:
			if pos >= end {
				goto done
			}
			inWord = true
			word = append(word[:0], unicode.ToLower(c))
			if pos < start {
				skipping = true // began in the previous part
			} else {
				skipping = false
			}
		case letter:
			word = append(word, unicode.ToLower(c))
		case inWord:
			inWord = false
			if !skipping && !stop[string(word)] {
				counts[string(word)]++
			}
			skipping = false
		default:
			skipping = false
			if pos >= end {
				goto done
			}
		}
		pos += int64(n)
	}
	if inWord && !skipping && !stop[string(word)] {
		counts[string(word)]++
	}
done:
	return counts, nil
}

func reduce() (map[string]int, error) {
	entries, err := os.ReadDir("/in")
	if err != nil {
		return nil, err
	}
	total := map[string]int{}
	for _, e := range entries {
		f, err := os.Open(filepath.Join("/in", e.Name()))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			w, n, ok := strings.Cut(sc.Text(), "\t")
			k, err := strconv.Atoi(n)
			if !ok || err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: bad line %q", e.Name(), sc.Text())
			}
			total[w] += k
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func writeCounts(path string, counts map[string]int) error {
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Strings(words)
	var b strings.Builder
	for _, w := range words {
		fmt.Fprintf(&b, "%s\t%d\n", w, counts[w])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func writeTop(path string, counts map[string]int, n int) error {
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Slice(words, func(i, j int) bool {
		if counts[words[i]] != counts[words[j]] {
			return counts[words[i]] > counts[words[j]]
		}
		return words[i] < words[j]
	})
	var b strings.Builder
	for i, w := range words {
		if i == n {
			break
		}
		fmt.Fprintf(&b, "%d %s\n", counts[w], w)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
