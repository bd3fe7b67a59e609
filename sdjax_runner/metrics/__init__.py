"""Images -> quality: CLIP score against the prompts, PSNR/SSIM against a reference run, and a sweep's
report of speed against quality. Metrics never fail a run: what cannot be measured is said, once."""
