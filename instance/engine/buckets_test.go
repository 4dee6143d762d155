package engine

import (
	"slices"
	"testing"
)

func TestBuckets(t *testing.T) {
	if got := Buckets(256); !slices.Equal(got, []int{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
		t.Errorf("buckets for 256 rows: %v", got)
	}
	if got := Buckets(3); !slices.Equal(got, []int{1, 2, 4}) {
		t.Errorf("buckets for 3 rows: %v", got)
	}
	if got := Buckets(1); !slices.Equal(got, []int{1}) {
		t.Errorf("buckets for 1 row: %v", got)
	}
}
