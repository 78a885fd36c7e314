"""Speech models: the encoder's audio input as each speech recognizer takes it; VITS's tokenizer for text-to-audio; the CTC heads' tokenizer."""
