package format

// Spec is one dense tensor a family needs: its canonical name (the
// checkpoint's name without the "model." or "model.language_model." prefix,
// with "mtp.layers.0." renamed "layers.<num_hidden_layers>."), its shape, and
// whether the packer quantises it. Norms, gates and routers stay float32:
// they are small, and routing decisions are sensitive to their precision.
type Spec struct {
	Name  string
	Shape []int
	Quant bool
}
