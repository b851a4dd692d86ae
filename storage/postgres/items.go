package postgres

import (
	"context"
	"errors"

	"github.com/dagrun/dagrun/storage"
)

// ListItems returns a page of a forEach step's items in index order.
func (s *Store) ListItems(ctx context.Context, p storage.ItemsParams) ([]storage.Item, error) {
	return nil, errors.New("ListItems: not implemented yet")
}
