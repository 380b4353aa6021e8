/*
 * csumsq N: the sum of i*i for i in [0, N), modulo 2^64, printed on stdout;
 * N is written to /out/n.txt. It reports progress and checkpoints (i and
 * the sum so far, 16 bytes little-endian) whenever one is due, and resumes
 * from the latest: the same task as docs/TASK_ABI.md's Go example, in C
 * through cyclepool.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cyclepool.h"

static void put64(unsigned char *b, uint64_t v) {
	for (int k = 0; k < 8; k++) b[k] = (unsigned char)(v >> (8 * k));
}

static uint64_t get64(const unsigned char *b) {
	uint64_t v = 0;
	for (int k = 0; k < 8; k++) v |= (uint64_t)b[k] << (8 * k);
	return v;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: csumsq N\n");
		return 2;
	}
	uint64_t n = strtoull(argv[1], NULL, 10), i = 0, sum = 0;
	unsigned char st[16];
	if (cyclepool_restore(st, sizeof st) == sizeof st) { /* resume */
		i = get64(st);
		sum = get64(st + 8);
	}
	for (; i < n; i++) {
		sum += i * i;
		if (i % 1000000 == 0) {
			cyclepool_progress((double)i / (double)n);
			if (cyclepool_checkpoint_due()) {
				put64(st, i + 1);
				put64(st + 8, sum); /* the state after step i */
				(void)cyclepool_checkpoint(st, sizeof st); /* a refusal is not fatal */
			}
		}
	}
	printf("%" PRIu64 "\n", sum);
	FILE *f = fopen("/out/n.txt", "w");
	if (!f) {
		perror("/out/n.txt");
		return 1;
	}
	fputs(argv[1], f);
	return fclose(f) == 0 ? 0 : 1;
}
