package experts

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
)

// RoutesFile, in a model written by `sluice synth`, holds recorded routes
// (a trained model's top-k per layer and position) for the forward to
// replay: random routers route uniformly, trained ones are skewed and
// correlated in time, and that is what decides an expert pool's hit rate.
const RoutesFile = "synth_routes.json"

// LoadRoutes returns the replay of dir's RoutesFile for config c, or nil
// when there is none. Recorded layer l%len, position pos%len drives every
// layer and position; each recorded expert e (of the recording's E0)
// becomes experts e*E/E0+j (j < ceil(K/K0)), rotated by layer so that
// layers sharing a recorded layer still touch different records. The
// function is for one runner (it counts sequences).
func LoadRoutes(dir string, c *format.Config) (model.RouteFunc, error) {
	b, err := os.ReadFile(filepath.Join(dir, RoutesFile))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r struct {
		Experts int       `json:"experts"`
		Routes  [][][]int `json:"routes"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Routes) == 0 || len(r.Routes[0]) == 0 || r.Experts <= 0 {
		return nil, fmt.Errorf("%s: no routes (%v)", RoutesFile, err)
	}
	E, K := c.Experts, c.TopK
	k0 := len(r.Routes[0][0])
	spread := E / r.Experts
	if spread < 1 || spread*k0 < K {
		return nil, fmt.Errorf("%s: %d recorded experts, top-%d, cannot drive %d experts, top-%d", RoutesFile, r.Experts, k0, E, K)
	}
	// Each new sequence (position 0 at the first expert layer, past any
	// leading dense layers, which never route) starts further into the
	// recording, so that repeated benchmark trials do not find the
	// previous trial's experts waiting in the pool.
	base, first := -1, c.FirstDense
	return func(layer, pos int, ids []int) {
		if layer == first && pos == 0 {
			base++
		}
		rl := r.Routes[layer%len(r.Routes)]
		rec := rl[(pos+max(base, 0)*397)%len(rl)]
		for k := range ids {
			ids[k] = (rec[k%k0]*spread + k/k0 + 7*layer) % E
		}
	}, nil
}
