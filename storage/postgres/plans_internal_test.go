package postgres

// wait returns once the first look is done and every statement queued so
// far is wrapped or left alone.
func (p *planFunctions) wait() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.working > 0 && p.ctx.Err() == nil {
		p.idle.Wait()
	}
}
