package records

// What the external tests need of the package's unexported constants.
const (
	MaxKey      = maxKey
	CompressMin = compressMin
)
