"""Speech recognition by encoder-decoders: the encoder's audio input as each model takes it."""
